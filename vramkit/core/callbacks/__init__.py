"""Lightning callbacks of vramkit, one per module."""
