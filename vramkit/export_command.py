"""``vramkit export`` (and ``python scripts/export.py``): a text-detection checkpoint to ONNX,
with int8 models and a parity check.

    vramkit export ckpt_path=<run>/checkpoints/last.ckpt

Overrides as for ``vramkit eval`` (the model and data configs the checkpoint was trained with)
and the ``export.*`` keys of conf/export.yaml. Writes dbnet.onnx, dbnet.int8_static.onnx,
dbnet.int8_dynamic.onnx and export.json into export.output_dir (the call's folder under
logs/<task>/exports/). Exit status: 0 when every model passes its parity and accuracy limits, 1
when one does not, 2 for a mistake on the command line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from omegaconf import DictConfig


def export(cfg: DictConfig) -> None:
    """Export ``cfg.ckpt_path``, print the parity summary; exit status 1 if a model fails."""
    from vramkit.core.run.library_chatter import hide_library_chatter, output_settings
    from vramkit.tasks.text_detection.export.export_checkpoint import RECORD_NAME, export_checkpoint

    # other libraries' chatter off unless verbose=true (a bad value is refused, before work)
    hide_library_chatter(output_settings(cfg.get("verbose"), config_file="conf/export.yaml"))
    record = export_checkpoint(cfg)
    summary = {
        name: {key: scores[key] for key in ("hmean", "max_abs_prob_diff") if key in scores}
        for name, scores in record["parity"].items()
    }
    print(json.dumps({"parity": summary, "passed": record["passed"]}, indent=2))
    print(f"models and {RECORD_NAME} in {cfg.export.output_dir}")
    if not all(record["passed"].values()):
        sys.exit(1)


def main(argv: Sequence[str]) -> int:
    """Run the export with the Hydra overrides `argv`; its exit status."""
    from vramkit.hydra_app import hydra_app

    return hydra_app("export", export, argv)
