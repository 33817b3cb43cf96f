"""Export a text-detection checkpoint to ONNX, with int8 models and a parity check.

    python scripts/export.py ckpt_path=<run>/checkpoints/last.ckpt format=onnx

Overrides as for eval.py (the model and data configs the checkpoint was trained with) and the
``export.*`` keys of conf/export.yaml. Writes dbnet.onnx, dbnet.int8_static.onnx,
dbnet.int8_dynamic.onnx and export.json into export.output_dir (the run folder under
logs/<task>/exports/); exits with 1 when a model fails its parity or accuracy limit.
"""

from __future__ import annotations

import json
import sys

import hydra
from omegaconf import DictConfig

from vramkit.core.run.library_chatter import hide_library_chatter, output_settings
from vramkit.core.run.override_typos import did_you_mean_on_refusal
from vramkit.core.run.refusals import refusals_as_messages
from vramkit.core.run.resolvers import register_resolvers
from vramkit.tasks.text_detection.export_checkpoint import RECORD_NAME, export_checkpoint

register_resolvers()  # before Hydra composes: the config reads the settled profile through them


@hydra.main(version_base="1.3", config_path="../conf", config_name="export")
def main(cfg: DictConfig) -> None:
    with refusals_as_messages():
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


if __name__ == "__main__":
    with did_you_mean_on_refusal("export"):  # a misspelt key: the key it resembles
        main()
