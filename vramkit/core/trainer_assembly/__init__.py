"""Trainer assembly: which callbacks a run registers, and vramkit's own visited by Lightning as one
group with only the batch hooks that have work, and the quiet no-op profiler it installs. No
callback lives here: these put the callbacks together."""
