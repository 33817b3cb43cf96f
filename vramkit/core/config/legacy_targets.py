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
    "vramkit.core.callbacks.activation_offload": "vramkit.core.callbacks.memory.activation_offload",
    "vramkit.core.callbacks.batch_hooks": "vramkit.core.trainer_assembly.batch_hooks",
    "vramkit.core.callbacks.callback_group": "vramkit.core.trainer_assembly.callback_group",
    "vramkit.core.callbacks.checkpoint_contract": (
        "vramkit.core.callbacks.checkpoints.checkpoint_contract"
    ),
    "vramkit.core.callbacks.checkpoint_retention": (
        "vramkit.core.callbacks.checkpoints.checkpoint_retention"
    ),
    "vramkit.core.callbacks.console_output": "vramkit.core.callbacks.progress.console_output",
    "vramkit.core.callbacks.finite_model_checkpoint": (
        "vramkit.core.callbacks.checkpoints.finite_model_checkpoint"
    ),
    "vramkit.core.callbacks.loader_position": "vramkit.core.callbacks.checkpoints.loader_position",
    "vramkit.core.callbacks.memory_monitor": "vramkit.core.callbacks.memory.memory_monitor",
    "vramkit.core.callbacks.oom_fault_injection": (
        "vramkit.core.callbacks.memory.oom_fault_injection"
    ),
    "vramkit.core.callbacks.pending_validation": (
        "vramkit.core.callbacks.checkpoints.pending_validation"
    ),
    "vramkit.core.callbacks.phase_memory_hygiene": (
        "vramkit.core.callbacks.memory.phase_memory_hygiene"
    ),
    "vramkit.core.callbacks.progress_bar": "vramkit.core.callbacks.progress.progress_bar",
    "vramkit.core.callbacks.progress_line": "vramkit.core.callbacks.progress.progress_line",
    "vramkit.core.callbacks.quiet_profiler": "vramkit.core.trainer_assembly.quiet_profiler",
    "vramkit.core.callbacks.random_state": "vramkit.core.callbacks.checkpoints.random_state",
    "vramkit.core.callbacks.resume_checkpoint": (
        "vramkit.core.callbacks.checkpoints.resume_checkpoint"
    ),
    "vramkit.core.callbacks.working_set": "vramkit.core.trainer_assembly.working_set",
    "vramkit.core.run.compose": "vramkit.core.run.settling.compose",
    "vramkit.core.run.config_preview": "vramkit.core.run.settling.config_preview",
    "vramkit.core.run.fit_to_budget": "vramkit.core.run.settling.fit_to_budget",
    "vramkit.core.run.held_stderr": "vramkit.core.run.refusal.held_stderr",
    "vramkit.core.run.multirun_report": "vramkit.core.run.records.multirun_report",
    "vramkit.core.run.multirun_summary": "vramkit.core.run.records.multirun_summary",
    "vramkit.core.run.override_typos": "vramkit.core.run.refusal.override_typos",
    "vramkit.core.run.plan_request_from_config": (
        "vramkit.core.run.settling.plan_request_from_config"
    ),
    "vramkit.core.run.refusals": "vramkit.core.run.refusal.exit_codes",
    "vramkit.core.run.refusal.refusals": "vramkit.core.run.refusal.exit_codes",
    "vramkit.core.run.requeue": "vramkit.core.run.folder.requeue",
    "vramkit.core.run.resolve_hardware": "vramkit.core.run.settling.resolve_hardware",
    "vramkit.core.run.resolvers": "vramkit.core.run.settling.resolvers",
    "vramkit.core.run.run_diff": "vramkit.core.run.records.run_diff",
    "vramkit.core.run.run_folder": "vramkit.core.run.folder.run_folder",
    "vramkit.core.run.run_folder_claim": "vramkit.core.run.folder.run_folder_claim",
    "vramkit.core.run.run_folder_lock": "vramkit.core.run.folder.run_folder_lock",
    "vramkit.core.run.run_folder_owner": "vramkit.core.run.folder.run_folder_owner",
    "vramkit.core.run.run_record": "vramkit.core.run.records.run_record",
    "vramkit.core.run.run_summary": "vramkit.core.run.records.run_summary",
    "vramkit.core.run.settle": "vramkit.core.run.settling.settle",
    "vramkit.datasets.arc_batching": "vramkit.tasks.sage.data.arc_batching",
    "vramkit.datasets.arc_data": "vramkit.tasks.sage.data.arc_data",
    "vramkit.datasets.arc_datamodule": "vramkit.tasks.sage.data.arc_datamodule",
    "vramkit.datasets.arc_examples": "vramkit.tasks.sage.data.arc_examples",
    "vramkit.datasets.arc_feature_datamodule": (
        "vramkit.tasks.sage.teacher_features.arc_feature_datamodule"
    ),
    "vramkit.datasets.arc_tasks": "vramkit.tasks.sage.data.arc_tasks",
    "vramkit.datasets.arc_teacher_datamodule": "vramkit.tasks.sage.data.arc_teacher_datamodule",
    "vramkit.datasets.augment": "vramkit.tasks.text_detection.data.augment",
    "vramkit.datasets.device_inputs": "vramkit.tasks.text_detection.data.device_inputs",
    "vramkit.datasets.icdar_folder": "vramkit.tasks.text_detection.data.icdar_folder",
    "vramkit.datasets.loader_workers": "vramkit.core.data.loader_workers",
    "vramkit.datasets.synthetic_text": "vramkit.tasks.text_detection.data.synthetic_text",
    "vramkit.datasets.text_classification": "vramkit.tasks.text_classification.datamodule",
    "vramkit.datasets.text_detection_datamodule": "vramkit.tasks.text_detection.data.datamodule",
    "vramkit.datasets.text_jsonl": "vramkit.tasks.text_classification.text_jsonl",
    "vramkit.datasets.text_renderer": "vramkit.tasks.text_detection.data.text_renderer",
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
    "vramkit.ocr.backbone": "vramkit.tasks.text_detection.network.backbone",
    "vramkit.ocr.db_head": "vramkit.tasks.text_detection.network.db_head",
    "vramkit.ocr.dbnet": "vramkit.tasks.text_detection.network.dbnet",
    "vramkit.ocr.evaluate": "vramkit.tasks.text_detection.evaluation.icdar_eval",
    "vramkit.ocr.fpn_neck": "vramkit.tasks.text_detection.network.fpn_neck",
    "vramkit.ocr.icdar_format": "vramkit.tasks.text_detection.data.icdar_format",
    "vramkit.ocr.loss": "vramkit.tasks.text_detection.network.loss",
    "vramkit.ocr.polygon_geometry": "vramkit.tasks.text_detection.data.polygon_geometry",
    "vramkit.ocr.postprocess": "vramkit.tasks.text_detection.network.postprocess",
    "vramkit.ocr.targets": "vramkit.tasks.text_detection.data.targets",
    "vramkit.optional_dependency": "vramkit.core.optional_dependency",
    "vramkit.run_logging": "vramkit.core.run.loggers",
    "vramkit.sage.commands": "vramkit.tasks.sage.teacher_features.commands",
    "vramkit.sage.compression_report": "vramkit.tasks.sage.compression_report",
    "vramkit.sage.feature_cache": "vramkit.tasks.sage.teacher_features.feature_cache",
    "vramkit.sage.feature_extraction": "vramkit.tasks.sage.teacher_features.feature_extraction",
    "vramkit.sage.grid_augment": "vramkit.tasks.sage.grids.grid_augment",
    "vramkit.sage.grid_loss": "vramkit.tasks.sage.grids.grid_loss",
    "vramkit.sage.grid_metrics": "vramkit.tasks.sage.grids.grid_metrics",
    "vramkit.sage.grid_outputs": "vramkit.tasks.sage.grids.grid_outputs",
    "vramkit.sage.grid_tokens": "vramkit.tasks.sage.grids.grid_tokens",
    "vramkit.sage.grid_transformer": "vramkit.tasks.sage.grid_transformer",
    "vramkit.sage.seed_student": "vramkit.tasks.sage.seed_student",
    "vramkit.sage.teacher_checkpoint": "vramkit.tasks.sage.teacher_features.teacher_checkpoint",
    "vramkit.tasks.sage.arc_batching": "vramkit.tasks.sage.data.arc_batching",
    "vramkit.tasks.sage.arc_data": "vramkit.tasks.sage.data.arc_data",
    "vramkit.tasks.sage.arc_datamodule": "vramkit.tasks.sage.data.arc_datamodule",
    "vramkit.tasks.sage.arc_examples": "vramkit.tasks.sage.data.arc_examples",
    "vramkit.tasks.sage.arc_feature_datamodule": (
        "vramkit.tasks.sage.teacher_features.arc_feature_datamodule"
    ),
    "vramkit.tasks.sage.arc_tasks": "vramkit.tasks.sage.data.arc_tasks",
    "vramkit.tasks.sage.arc_teacher_datamodule": "vramkit.tasks.sage.data.arc_teacher_datamodule",
    "vramkit.tasks.sage.commands": "vramkit.tasks.sage.teacher_features.commands",
    "vramkit.tasks.sage.feature_cache": "vramkit.tasks.sage.teacher_features.feature_cache",
    "vramkit.tasks.sage.feature_extraction": (
        "vramkit.tasks.sage.teacher_features.feature_extraction"
    ),
    "vramkit.tasks.sage.grid_augment": "vramkit.tasks.sage.grids.grid_augment",
    "vramkit.tasks.sage.grid_loss": "vramkit.tasks.sage.grids.grid_loss",
    "vramkit.tasks.sage.grid_metrics": "vramkit.tasks.sage.grids.grid_metrics",
    "vramkit.tasks.sage.grid_outputs": "vramkit.tasks.sage.grids.grid_outputs",
    "vramkit.tasks.sage.grid_tokens": "vramkit.tasks.sage.grids.grid_tokens",
    "vramkit.tasks.sage.teacher_checkpoint": (
        "vramkit.tasks.sage.teacher_features.teacher_checkpoint"
    ),
    "vramkit.tasks.text_detection.annotation_checks": (
        "vramkit.tasks.text_detection.data.annotation_checks"
    ),
    "vramkit.tasks.text_detection.augment": "vramkit.tasks.text_detection.data.augment",
    "vramkit.tasks.text_detection.backbone": "vramkit.tasks.text_detection.network.backbone",
    "vramkit.tasks.text_detection.backend_parity": (
        "vramkit.tasks.text_detection.export.backend_parity"
    ),
    "vramkit.tasks.text_detection.datamodule": "vramkit.tasks.text_detection.data.datamodule",
    "vramkit.tasks.text_detection.db_head": "vramkit.tasks.text_detection.network.db_head",
    "vramkit.tasks.text_detection.dbnet": "vramkit.tasks.text_detection.network.dbnet",
    "vramkit.tasks.text_detection.device_inputs": "vramkit.tasks.text_detection.data.device_inputs",
    "vramkit.tasks.text_detection.evaluate": "vramkit.tasks.text_detection.evaluation.evaluate",
    "vramkit.tasks.text_detection.export_checkpoint": (
        "vramkit.tasks.text_detection.export.export_checkpoint"
    ),
    "vramkit.tasks.text_detection.export_settings": (
        "vramkit.tasks.text_detection.export.export_settings"
    ),
    "vramkit.tasks.text_detection.fpn_neck": "vramkit.tasks.text_detection.network.fpn_neck",
    "vramkit.tasks.text_detection.icdar_eval": "vramkit.tasks.text_detection.evaluation.icdar_eval",
    "vramkit.tasks.text_detection.icdar_folder": "vramkit.tasks.text_detection.data.icdar_folder",
    "vramkit.tasks.text_detection.icdar_format": "vramkit.tasks.text_detection.data.icdar_format",
    "vramkit.tasks.text_detection.loss": "vramkit.tasks.text_detection.network.loss",
    "vramkit.tasks.text_detection.onnx_export": "vramkit.tasks.text_detection.export.onnx_export",
    "vramkit.tasks.text_detection.onnx_inference": (
        "vramkit.tasks.text_detection.export.onnx_inference"
    ),
    "vramkit.tasks.text_detection.onnx_quantize": (
        "vramkit.tasks.text_detection.export.onnx_quantize"
    ),
    "vramkit.tasks.text_detection.polygon_geometry": (
        "vramkit.tasks.text_detection.data.polygon_geometry"
    ),
    "vramkit.tasks.text_detection.postprocess": "vramkit.tasks.text_detection.network.postprocess",
    "vramkit.tasks.text_detection.report_figures": (
        "vramkit.tasks.text_detection.evaluation.report_figures"
    ),
    "vramkit.tasks.text_detection.rrc_files": "vramkit.tasks.text_detection.evaluation.rrc_files",
    "vramkit.tasks.text_detection.rrc_geometry": (
        "vramkit.tasks.text_detection.evaluation.rrc_geometry"
    ),
    "vramkit.tasks.text_detection.rrc_protocol": (
        "vramkit.tasks.text_detection.evaluation.rrc_protocol"
    ),
    "vramkit.tasks.text_detection.submission_writer": (
        "vramkit.tasks.text_detection.evaluation.submission_writer"
    ),
    "vramkit.tasks.text_detection.synthetic_text": (
        "vramkit.tasks.text_detection.data.synthetic_text"
    ),
    "vramkit.tasks.text_detection.targets": "vramkit.tasks.text_detection.data.targets",
    "vramkit.tasks.text_detection.text_renderer": "vramkit.tasks.text_detection.data.text_renderer",
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
