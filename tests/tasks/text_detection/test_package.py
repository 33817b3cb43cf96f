"""Importing the text detection package keeps albumentations off the network."""

from __future__ import annotations

import subprocess
import sys


def test_albumentations_does_not_ask_pypi_for_updates():
    code = (
        "import os, urllib.request\n"
        "os.environ.pop('NO_ALBUMENTATIONS_UPDATE', None)\n"
        "def refuse(*args, **kwargs):\n"
        "    raise SystemExit('network: ' + str(args[1] if len(args) > 1 else args))\n"
        "urllib.request.OpenerDirector.open = refuse\n"
        "import vramkit.tasks.text_detection.data.augment\n"
        "print('offline')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-500:]
    assert result.stdout.strip() == "offline"
