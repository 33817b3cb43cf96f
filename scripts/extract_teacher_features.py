"""Cache the teacher's features of the student's data (step 2 of the SAGE chain).

    python scripts/extract_teacher_features.py task=sage_distill [same overrides as training]

Composes the same config as ``python train.py task=sage_distill ...``, so the cache lands where
the student's datamodule looks for it (``data.feature_cache``). The teacher is
``teacher.checkpoint`` (``latest``: the newest ``task=arc_teacher`` run), or a plug-in module
given by ``teacher.net._target_``. Does nothing when a complete, matching cache exists.
"""

import hydra
from omegaconf import DictConfig

from vramkit.core.run.refusals import refusals_as_messages
from vramkit.core.run.resolvers import register_resolvers
from vramkit.tasks.sage.feature_extraction import run_extraction

register_resolvers()  # before Hydra composes, as in train.py


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    with refusals_as_messages():  # a refused teacher or cache: one line, exit 2, no run folder
        run_extraction(cfg)


if __name__ == "__main__":
    main()
