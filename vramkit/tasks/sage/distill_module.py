"""SAGE distillation: a small grid transformer learns the task and the teacher's features.

The student reads the grid tokens (never the teacher's features); its last states go through
the *projector* (student width → teacher width), a layer of this module, so it is optimised
with the student and saved in every checkpoint. The loss is

    task × (cell_ce + size × size_ce) + feature × (mse × MSE + cosine × (1 − cos))

over non-padding cells and tokens (weights in ``model.loss``). Validation scores the student,
the teacher (its predictions cached with the features, same examples) and the copy baseline
side by side; at the end of fit the compression report (parameters, latency at batch 1 and 32
on this device, scores) is printed and saved as ``compression_report.json`` in the run folder.

*The student* is one file: the best checkpoint by the monitored metric (what the run's last line
names). The report's scores are the validation scores saved inside that checkpoint, so they are
that file's, not the last epoch's; a run without a ranked checkpoint (``fast_dev_run``) reports
its last validation and says so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vramkit.core.io.safe_load import load_weights_only
from vramkit.core.optim.scheduled_module import OptimizerFactory
from vramkit.tasks.sage.compression_report import (
    ModelRow,
    build_report,
    count_parameters,
    format_report,
    latency_batches,
    measure_latency_ms,
)
from vramkit.tasks.sage.data.arc_batching import FEATURES_KEY
from vramkit.tasks.sage.grid_module import COPY, MODEL, SCORES_KEY, GridModelModule
from vramkit.tasks.sage.grids.grid_loss import DistillLossWeights, feature_distillation
from vramkit.tasks.sage.grids.grid_outputs import GridOutput, GridPrediction
from vramkit.tasks.sage.teacher_features.feature_cache import MANIFEST_NAME
from vramkit.tasks.sage.teacher_features.teacher_checkpoint import file_sha256, load_teacher

log = logging.getLogger(__name__)

TEACHER = "teacher_"  # metric-name prefix of the teacher's scores
REPORT_NAME = "compression_report.json"


class SageDistillModule(GridModelModule):
    """The student, its projector to the teacher's width, and the distillation loss.

    ``teacher_width`` may be left out: it is then read from the datamodule's feature cache in
    ``setup`` (and recorded in the hyperparameters, so the checkpoint reloads on its own).
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        lr_schedule: dict[str, Any] | None = None,
        loss: Mapping[str, float] | None = None,
        teacher_width: int | None = None,
        report: Mapping[str, Any] | None = None,
        compile: bool = False,
        changed_weight: float = 1.0,
    ) -> None:
        self.weights = DistillLossWeights(**(loss or {}))
        super().__init__(net, optimizer, lr_schedule, self.weights.size, compile, changed_weight)
        self.save_hyperparameters(ignore=["net", "optimizer"])
        report = dict(report or {})
        self.report_batch_sizes = tuple(report.pop("batch_sizes", (1, 32)))
        self.report_repeats = int(report.pop("repeats", 3))
        if report:
            raise ValueError(f"model.report: unknown option(s) {sorted(report)}")
        self.projector: nn.Linear | None = None
        if teacher_width is not None:
            self._build_projector(teacher_width)

    def _build_projector(self, teacher_width: int) -> None:
        if (
            isinstance(teacher_width, bool)
            or not isinstance(teacher_width, int)
            or teacher_width <= 0
        ):
            raise ValueError(f"teacher width must be a positive integer, got {teacher_width!r}")
        self.projector = nn.Linear(self.net.width, teacher_width)
        self.hparams["teacher_width"] = teacher_width

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        cached = getattr(datamodule, "teacher_width", None) if datamodule is not None else None
        if cached is None:
            if self.projector is None:
                raise ValueError(
                    "the teacher width is unknown: give model.teacher_width or a datamodule with "
                    "a feature cache (data=arc_features)"
                )
            return
        if self.projector is None:
            self._build_projector(cached)
        elif self.projector.out_features != cached:
            raise ValueError(
                f"model.teacher_width={self.projector.out_features} but the feature cache holds "
                f"{cached}-wide teacher features"
            )

    SCORED = (*GridModelModule.SCORED, TEACHER)
    EXTRA_LOSSES = ("task_loss", "feature_loss")
    MEAN_UNITS: Mapping[str, str] = {
        **GridModelModule.MEAN_UNITS,
        "feature_mse": "tokens",
        "feature_cosine": "tokens",
    }

    def _means(self, output: GridOutput, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.projector is None:
            # Only the memory planner steps a module that setup() has not seen: the width of
            # the batch's teacher features is the one setup() would read from the cache.
            self._build_projector(int(batch[FEATURES_KEY].shape[-1]))
            self.projector.to(device=output.hidden.device, dtype=output.hidden.dtype)
        means = super()._means(output, batch)
        projected = self.projector(output.hidden)
        features = feature_distillation(projected, batch[FEATURES_KEY], batch["padding_mask"])
        return {**means, "feature_mse": features["mse"], "feature_cosine": features["cosine"]}

    def _mean_weights(self) -> dict[str, float]:
        weights = self.weights
        return {
            "cell_ce": weights.task,
            "size_ce": weights.task * weights.size,
            "feature_mse": weights.feature * weights.mse,
            "feature_cosine": weights.feature * weights.cosine,
        }

    def _losses(
        self, means: Mapping[str, torch.Tensor], loss: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        weights = self.weights
        task = means["cell_ce"]
        if "size_ce" in means:
            task = task + weights.size * means["size_ce"]
        feature = weights.mse * means["feature_mse"] + weights.cosine * means["feature_cosine"]
        return {**super()._losses(means, loss), "task_loss": task, "feature_loss": feature}

    def _score_references(self, batch: dict[str, torch.Tensor]) -> None:
        # the teacher's predictions of these very examples, cached at extraction
        if "teacher_cells" in batch:
            teacher = GridPrediction(cells=batch["teacher_cells"], size=batch["teacher_size"])
            self.scoreboard.add(
                TEACHER, teacher, batch["target"], batch["target_size"], batch["query_grid"]
            )

    def on_fit_end(self) -> None:
        if self.trainer.is_global_zero:
            self.write_compression_report(Path(self.trainer.default_root_dir))

    def write_compression_report(self, run_dir: Path) -> dict[str, Any]:
        """Measure, print and save (``run_dir/compression_report.json``) the report."""
        datamodule = self.trainer.datamodule
        batches = latency_batches(datamodule.val_dataset, self.report_batch_sizes, self.device)
        scores, student_checkpoint = student_scores(self.trainer, self.last_scores)
        student = ModelRow(
            "student",
            count_parameters(self.net),
            self._latencies(self.net, batches),
            scores.get(MODEL),
        )
        teacher_module, teacher_note = self._load_teacher(
            datamodule.cache.manifest["teacher"], datamodule.cache.directory / MANIFEST_NAME
        )
        teacher = ModelRow(
            "teacher",
            int(datamodule.cache.manifest["teacher"]["parameters"]),
            self._latencies(teacher_module, batches) if teacher_module is not None else {},
            scores.get(TEACHER),
        )
        copy = ModelRow("copy_input", 0, {}, scores.get(COPY))
        report = build_report(
            [teacher, student, copy],
            device=_device_name(self.device),
            batch_sizes=self.report_batch_sizes,
            extra={
                "projector_parameters": count_parameters(self.projector),
                "validation_examples": len(datamodule.val_dataset),
                "latency_sequence_tokens": {
                    str(size): int(batch["tokens"].shape[1]) for size, batch in batches.items()
                },
                "teacher_checkpoint": datamodule.cache.manifest["teacher"]["checkpoint"],
                "teacher_note": teacher_note,
                "student_checkpoint": student_checkpoint,
            },
        )
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / REPORT_NAME).write_text(json.dumps(report, indent=2))
        # vramkit's own logger: the table is the chain's result and must not be filtered with
        # Lightning's chatter
        log.info(
            "SAGE: teacher, student and copy-the-input on the same %d validation examples "
            "(%s):\n%s\nthe student is %s",
            len(datamodule.val_dataset),
            run_dir / REPORT_NAME,
            format_report(report),
            student_checkpoint["description"],
        )
        return report

    def _load_teacher(
        self, info: Mapping[str, Any], manifest: Path
    ) -> tuple[nn.Module | None, str | None]:
        checkpoint = Path(info["checkpoint"])
        if not checkpoint.is_file() or file_sha256(checkpoint) != info["sha256"]:
            note = f"teacher checkpoint {checkpoint} is gone or changed: no teacher latency"
            log.warning(note)
            return None, note
        loaded = load_teacher(
            checkpoint,
            info["network"],
            state_dict_prefix=info.get("state_dict_prefix"),
            net_config_file=manifest,
        )
        return loaded.module.to(self.device), None

    def _latencies(
        self, network: nn.Module, batches: Mapping[int, dict[str, torch.Tensor]]
    ) -> dict[int, float]:
        run = (
            network.predict
            if callable(getattr(network, "predict", None))
            else network.encode_inputs
        )
        was_training = network.training
        network.eval()
        latencies = {}
        with torch.inference_mode(), self.trainer.precision_plugin.forward_context():
            for size, batch in batches.items():
                latencies[size] = measure_latency_ms(
                    lambda batch=batch: run(batch), self.device, repeats=self.report_repeats
                )
        network.train(was_training)
        return latencies


def student_scores(
    trainer: Any, last_scores: Mapping[str, dict[str, float]]
) -> tuple[Mapping[str, dict[str, float]], dict[str, Any]]:
    """The validation scores of *the student*, and which weights they are.

    The student is the checkpoint that ``trainer.checkpoint_callback`` ranks best by its monitored
    metric; its scores are the ones saved inside it (:data:`SCORES_KEY`). Without a ranked
    checkpoint (or one holding no scores), ``last_scores`` (the last validation) stand in and
    the description says so.
    """
    callback = trainer.checkpoint_callback
    path = getattr(callback, "best_model_path", "") or ""
    monitor = getattr(callback, "monitor", None)
    saved = load_weights_only(path, mmap=True) if path and monitor else {}
    if SCORES_KEY not in saved:
        why = f"{path} holds no scores" if saved else "no checkpoint ranked by a monitored metric"
        end = f"the weights at the end of training ({why})"
        return last_scores, {"path": None, "description": end}
    value = float(callback.best_model_score)
    description = (
        f"{path}: the best {monitor} ({value:.4f}) at epoch {saved['epoch']}, "
        "scored above from that file"
    )
    return saved[SCORES_KEY], {
        "path": str(path),
        "monitor": monitor,
        "score": value,
        "epoch": int(saved["epoch"]),
        "description": description,
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"
