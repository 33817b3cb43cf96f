"""``vramkit extract-features`` (and ``python scripts/extract_teacher_features.py``): cache the
teacher's features of the student's data (step 2 of the SAGE chain).

    vramkit extract-features task=sage_distill [same overrides as training]

Composes the same config as ``vramkit train task=sage_distill ...``, so the cache lands where
the student's datamodule looks for it (``data.feature_cache``). The teacher is
``teacher.checkpoint`` (``latest``: the newest ``task=arc_teacher`` run), or a plug-in module
given by ``teacher.net._target_``. Does nothing when a complete, matching cache exists.

The call's own records (Hydra's ``.hydra/`` and ``extract_features.log``) go to
``logs/<task>/features/<time>/``, not to a folder among the training runs: it trains nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

JOB_NAME = "extract_features"
RUN_DIR = "hydra.run.dir='${run_folder:${paths.log_dir}/${task_name}/features}'"
"""The call's folder, claimed as eval's and export's are (conf/hydra/tool.yaml): quoted, so
Hydra's override grammar keeps the nested interpolation for OmegaConf to resolve."""


def extract(cfg: DictConfig) -> None:
    """Write the feature cache `cfg` describes (or find it complete); another task than the
    student's is refused (a `ConfigError`: one line, exit 2, no folder)."""
    from vramkit.core.config.schema import ConfigError
    from vramkit.tasks.sage.teacher_features.arc_feature_datamodule import STUDENT_TASK
    from vramkit.tasks.sage.teacher_features.feature_extraction import run_extraction

    if cfg.get("task_name") != STUDENT_TASK:
        raise ConfigError(
            f"task_name (conf/task/*.yaml): the features are made for the student's data: run "
            f"with task={STUDENT_TASK} (or an experiment that selects it, e.g. "
            f"experiment=sage_small); got {cfg.get('task_name')!r}",
            ("task_name",),
        )
    run_extraction(cfg)


def main(argv: Sequence[str]) -> int:
    """Run the extraction with the Hydra overrides `argv`; its exit status."""
    from vramkit.hydra_app import hydra_app

    overrides = list(argv)
    if not any(arg.startswith("hydra.run.dir=") for arg in overrides):
        overrides.insert(0, RUN_DIR)
    return hydra_app("train", extract, overrides, job_name=JOB_NAME)
