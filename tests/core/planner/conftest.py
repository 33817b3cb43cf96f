"""The planner's tests, one folder per layer of `vramkit/core/planner`, share the models and fake
traces of this folder (`planning_models`, `fake_traces`, ...): it goes on the import path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
