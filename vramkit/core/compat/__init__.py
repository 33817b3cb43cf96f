"""The one door to each library's private names: one module per library.

Outside the planner (which models torch internals on purpose, ``vramkit/core/planner``), every
use of a private name of Lightning, torch, Hydra or OmegaConf goes through the module of its
library here, where each accessor names the versions it was checked on and a test in
``tests/core/compat`` fails when the installed version changes it. ``pyproject.toml``'s comment
beside each pin lists exactly the private names used here (a test compares them), and a test
walks the source tree for any private name used elsewhere.
"""
