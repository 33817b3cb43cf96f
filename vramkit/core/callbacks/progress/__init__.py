"""Progress on the console: a rich bar on a terminal, steady lines in a log file, and which of the
two the output is."""
