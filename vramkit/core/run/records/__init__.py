"""What a run leaves on record: the code and environment it ran with, its last lines, the
differences between two runs, and the summary and report of a multirun."""
