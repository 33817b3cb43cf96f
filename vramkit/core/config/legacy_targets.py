"""Where the modules of vramkit's first layout live now, for ``_target_`` paths stored on disk.

Teacher checkpoints (``sage_teacher_network``), feature-cache manifests and users' own config
files written before the move to ``vramkit/core`` and ``vramkit/tasks`` name classes by their old
module paths (``vramkit.sage.grid_transformer.GridTransformer``). They keep loading: an old path
is rewritten to the current one, with a warning that says what to write instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vramkit.core.compat import omegaconf_private

MOVED_MODULES: dict[str, str] = {
    "vramkit.callbacks": "vramkit.core.callbacks",
    "vramkit.checkpoint_io": "vramkit.core.io.checkpoint_io",
    "vramkit.datasets.arc_batching": "vramkit.tasks.sage.arc_batching",
    "vramkit.datasets.arc_data": "vramkit.tasks.sage.arc_data",
    "vramkit.datasets.arc_datamodule": "vramkit.tasks.sage.arc_datamodule",
    "vramkit.datasets.arc_examples": "vramkit.tasks.sage.arc_examples",
    "vramkit.datasets.arc_feature_datamodule": "vramkit.tasks.sage.arc_feature_datamodule",
    "vramkit.datasets.arc_tasks": "vramkit.tasks.sage.arc_tasks",
    "vramkit.datasets.arc_teacher_datamodule": "vramkit.tasks.sage.arc_teacher_datamodule",
    "vramkit.datasets.augment": "vramkit.tasks.text_detection.augment",
    "vramkit.datasets.device_inputs": "vramkit.tasks.text_detection.device_inputs",
    "vramkit.datasets.icdar_folder": "vramkit.tasks.text_detection.icdar_folder",
    "vramkit.datasets.loader_workers": "vramkit.core.data.loader_workers",
    "vramkit.datasets.synthetic_text": "vramkit.tasks.text_detection.synthetic_text",
    "vramkit.datasets.text_classification": "vramkit.tasks.text_classification.datamodule",
    "vramkit.datasets.text_detection_datamodule": "vramkit.tasks.text_detection.datamodule",
    "vramkit.datasets.text_jsonl": "vramkit.tasks.text_classification.text_jsonl",
    "vramkit.datasets.text_renderer": "vramkit.tasks.text_detection.text_renderer",
    "vramkit.datasets.toy_text_classification": "vramkit.tasks.text_classification.toy_data",
    "vramkit.datasets.validation_cache": "vramkit.core.io.disk_cache",
    "vramkit.evaluation": "vramkit.core.run.evaluate",
    "vramkit.hardware": "vramkit.core.hardware",
    "vramkit.hardware.planner": "vramkit.core.planner",
    "vramkit.instantiate": "vramkit.core.config.instantiate",
    "vramkit.lightning_modules.arc_teacher": "vramkit.tasks.sage.grid_module",
    "vramkit.lightning_modules.batch_split": "vramkit.core.oom.batch_split",
    "vramkit.lightning_modules.grad_arrivals": "vramkit.core.oom.grad_arrivals",
    "vramkit.lightning_modules.guarded_steps": "vramkit.core.oom.guarded_steps",
    "vramkit.lightning_modules.hf_classifier": "vramkit.tasks.text_classification.hf_classifier",
    "vramkit.lightning_modules.log_buffer": "vramkit.core.oom.log_buffer",
    "vramkit.lightning_modules.lr_schedules": "vramkit.core.optim.lr_schedules",
    "vramkit.lightning_modules.oom_policy": "vramkit.core.oom.policy",
    "vramkit.lightning_modules.oom_resilient": "vramkit.core.oom.resilient_module",
    "vramkit.lightning_modules.sage_distill": "vramkit.tasks.sage.distill_module",
    "vramkit.lightning_modules.text_classification": "vramkit.tasks.text_classification.module",
    "vramkit.lightning_modules.text_detection": "vramkit.tasks.text_detection.module",
    "vramkit.ocr.backbone": "vramkit.tasks.text_detection.backbone",
    "vramkit.ocr.db_head": "vramkit.tasks.text_detection.db_head",
    "vramkit.ocr.dbnet": "vramkit.tasks.text_detection.dbnet",
    "vramkit.ocr.evaluate": "vramkit.tasks.text_detection.icdar_eval",
    "vramkit.ocr.fpn_neck": "vramkit.tasks.text_detection.fpn_neck",
    "vramkit.ocr.icdar_format": "vramkit.tasks.text_detection.icdar_format",
    "vramkit.ocr.loss": "vramkit.tasks.text_detection.loss",
    "vramkit.ocr.polygon_geometry": "vramkit.tasks.text_detection.polygon_geometry",
    "vramkit.ocr.postprocess": "vramkit.tasks.text_detection.postprocess",
    "vramkit.ocr.targets": "vramkit.tasks.text_detection.targets",
    "vramkit.optional_dependency": "vramkit.core.optional_dependency",
    "vramkit.run_logging": "vramkit.core.run.loggers",
    "vramkit.sage.commands": "vramkit.tasks.sage.commands",
    "vramkit.sage.compression_report": "vramkit.tasks.sage.compression_report",
    "vramkit.sage.feature_cache": "vramkit.tasks.sage.feature_cache",
    "vramkit.sage.feature_extraction": "vramkit.tasks.sage.feature_extraction",
    "vramkit.sage.grid_augment": "vramkit.tasks.sage.grid_augment",
    "vramkit.sage.grid_loss": "vramkit.tasks.sage.grid_loss",
    "vramkit.sage.grid_metrics": "vramkit.tasks.sage.grid_metrics",
    "vramkit.sage.grid_outputs": "vramkit.tasks.sage.grid_outputs",
    "vramkit.sage.grid_tokens": "vramkit.tasks.sage.grid_tokens",
    "vramkit.sage.grid_transformer": "vramkit.tasks.sage.grid_transformer",
    "vramkit.sage.seed_student": "vramkit.tasks.sage.seed_student",
    "vramkit.sage.teacher_checkpoint": "vramkit.tasks.sage.teacher_checkpoint",
    "vramkit.training": "vramkit.core.run.train",
}
"""Old module (or package) path → current path; the longest matching prefix wins."""


def current_target(target: str) -> str:
    """``target`` (``module.Class``) with a moved module's old path replaced by its new one.

    A module that moved twice (``vramkit.callbacks`` became ``vramkit.core.callbacks``, whose
    modules later moved into subpackages) is followed to where it is now.
    """
    moved = target
    for _ in range(len(MOVED_MODULES)):  # each hop uses another entry: the table has no loop
        again = _one_move(moved)
        if again == moved:
            break
        moved = again
    if moved != target:
        warnings.warn(
            f"_target_ {target} is a path of vramkit's old layout; it now is {moved} "
            f"(loaded as that; write the new path in configs)",
            FutureWarning,
            stacklevel=2,
        )
    return moved


def _one_move(target: str) -> str:
    """``target`` with the longest moved prefix replaced once; itself when nothing moved."""
    module = target
    while module:
        new = MOVED_MODULES.get(module)
        if new is not None:
            return new + target[len(module) :]
        module = module.rpartition(".")[0]
    return target


def upgrade_targets(node: Any) -> Any:
    """A copy of a config node (mapping or DictConfig) with every old ``_target_`` rewritten.

    The node itself is returned when nothing in it names an old path.
    """
    if isinstance(node, DictConfig):
        plain = OmegaConf.to_container(node, resolve=False)
        upgraded = upgrade_targets(plain)
        parent = omegaconf_private.parent_of(node)
        return node if upgraded is plain else OmegaConf.create(upgraded, parent=parent)
    if isinstance(node, Mapping):
        changed = {key: upgrade_targets(value) for key, value in node.items()}
        target = node.get("_target_")
        if isinstance(target, str):
            changed["_target_"] = current_target(target)
        same = all(changed[key] is value for key, value in node.items())
        return node if same else changed
    if isinstance(node, list):
        changed_list = [upgrade_targets(value) for value in node]
        same = all(new is old for new, old in zip(changed_list, node, strict=True))
        return node if same else changed_list
    return node
