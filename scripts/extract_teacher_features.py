"""Cache the teacher's features of the student's data (step 2 of the SAGE chain).

    python scripts/extract_teacher_features.py task=sage_distill [same overrides as training]

The same as ``vramkit extract-features ...`` (vramkit/extract_features_command.py: where the
cache and the call's records go).
"""

from __future__ import annotations

import sys

from vramkit.extract_features_command import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
