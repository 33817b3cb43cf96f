"""Export a text-detection checkpoint to ONNX, with int8 models and a parity check.

    python scripts/export.py ckpt_path=<run>/checkpoints/last.ckpt format=onnx

The same as ``vramkit export ...`` (vramkit/export_command.py: the overrides, what it writes,
the exit status).
"""

from __future__ import annotations

import sys

from vramkit.export_command import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
