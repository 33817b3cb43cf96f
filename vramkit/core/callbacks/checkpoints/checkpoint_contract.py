"""Every checkpoint carries its resume contract, and a resume applies what may differ from it.

The contract (:data:`CONTRACT_KEY` in the checkpoint dictionary) holds the settings that make a
resumed run continue the checkpoint's exactly: the run's composed settings that decide what trains
(model, optimizer, schedule, data, seed, clipping, accumulation as the user set them, unresolved
but for class defaults, ``${settings_default:…}``, recorded as values),
the batch as settled (samples per device and batch, batches accumulated, processes, precision)
and the number of training samples. A checkpoint copied away from its run folder is checked
against it (`vramkit.core.run.resume_contract`); this callback writes it and, on a resume,

- regroups the loops' batch counters and the loaders' positions when the run trains the same
  samples per optimizer step in smaller batches (`regroup_batches`: batch 4 -> batch 1 with 4
  batches accumulated: a position of 3 batches is one of 12), so the epoch continues at its next
  sample instead of counting the old batches as new ones;
- applies the optimizer's settings the resume changed (``resume.allow_changes=true``) once the
  checkpoint's optimizer state is loaded, which otherwise brings back the checkpoint's: the
  learning rate to every parameter group and to the schedule's base rates (so the schedule goes
  on at the new peak), other parameter-group settings (weight decay, betas, eps) as given, and
  the warm-up / decay settings of vramkit's `WarmupDecayLR`; a change it cannot apply (a setting
  the optimizer's groups do not hold) stops the run with `ConfigError`;
- refuses a training set of another size than the checkpoint's, unless allowed.
"""

from __future__ import annotations

import logging
from fractions import Fraction
from typing import Any

import lightning as L

from vramkit.core.compat import torch_private
from vramkit.core.config.schema import ConfigError
from vramkit.core.optim.lr_schedules import WarmupDecayLR, WarmupDecaySchedule

log = logging.getLogger(__name__)

CONTRACT_KEY = "vramkit_resume_contract"
"""The checkpoint dictionary's key of the contract."""

OPTIMIZER_PREFIX = "model.optimizer."
SCHEDULE_PREFIX = "model.lr_schedule."
_NOT_GROUP_SETTINGS = ("_target_", "_partial_")

_LOOP_COUNTERS = ("ready", "started", "processed", "completed")


class CheckpointContract(L.Callback):
    """Writes ``contract`` into every checkpoint of the fit; on a resume, regroups batch counters,
    applies optimizer and schedule changes and checks the training set's size (module doc).

    Built by ``train()`` from the run's settled config (`vramkit.core.run.resume_contract`), not
    from a config node: it has no settings of its own.
    """

    def __init__(self, contract: dict[str, Any], *, allow_changes: bool = False) -> None:
        self.contract = contract
        self.allow_changes = allow_changes
        self._saved: dict[str, Any] | None = None  # the resumed checkpoint's contract

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        samples = training_samples(trainer)
        checkpoint[CONTRACT_KEY] = {**self.contract, "train_samples": samples}

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Before Lightning restores the loops and the callbacks' states from the same dict
        # (CheckpointConnector.restore_callbacks runs before restore_training_state).
        saved = checkpoint.get(CONTRACT_KEY)
        shaped = isinstance(saved, dict) and isinstance(saved.get("batch"), dict)
        self._saved = saved if shaped else None  # another shape: a checkpoint without one
        if self._saved is None:
            return
        before = int(self._saved["batch"]["per_device"])
        now = int(self.contract["batch"]["per_device"])
        if before != now:
            regroup_batches(checkpoint, Fraction(before, now))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        self._check_samples(trainer, saved.get("train_samples"))
        old, new = saved.get("settings", {}), self.contract.get("settings", {})
        changed = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
        if changed and not self.allow_changes:
            # train.py refuses these before any work (ResumeContract); train(cfg) called in
            # code gets no Hydra callback, and must not train other settings silently either.
            listed = "; ".join(f"{k}: {old.get(k)} -> {new.get(k)}" for k in sorted(changed))
            raise ConfigError(
                f"ckpt_path: a resume continues the run exactly, and these settings differ from "
                f"the checkpoint's: {listed}; resume with its settings, apply them with "
                "resume.allow_changes=true, or start a new run with init_from=<ckpt>",
                ("ckpt_path",),
            )
        optimizer = sorted(k for k in changed if k.startswith(OPTIMIZER_PREFIX))
        optimizer = [k for k in optimizer if k.removeprefix(OPTIMIZER_PREFIX) not in ("_target_",)]
        for key in optimizer:
            apply_optimizer_setting(trainer, key, old.get(key), new.get(key))
        if any(k.startswith(SCHEDULE_PREFIX) for k in changed):
            apply_schedule(trainer, pl_module)

    def _check_samples(self, trainer: L.Trainer, before: int | None) -> None:
        now = training_samples(trainer)
        if before is None or now is None or before == now:
            return
        change = f"the training set: {before} -> {now} samples"
        if not self.allow_changes:
            raise ConfigError(
                f"ckpt_path: a resume continues the run exactly, and {change} (its epochs and "
                "sample order differ); resume with the run's data, or apply it with "
                "resume.allow_changes=true",
                ("ckpt_path",),
            )
        log.warning("resume: applying %s (resume.allow_changes=true)", change)


def training_samples(trainer: L.Trainer) -> int | None:
    """The number of samples of the run's training loaders (None when a loader has no length)."""
    loaders = torch_private.tree_leaves(trainer.train_dataloader)
    try:
        return sum(len(loader.dataset) for loader in loaders) if loaders else None
    except (TypeError, AttributeError):  # an iterable dataset, or no loader yet
        return None


def regroup_batches(checkpoint: dict[str, Any], ratio: Fraction) -> None:
    """Count the checkpoint's positions in batches ``ratio`` times as many (old per-device batch
    / new): the current epoch's batch counters of the training loop and every saved loader
    position (``batches_done``). A position that is no whole number of new batches is refused:
    the run would skip or repeat samples."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit_loop.get("epoch_loop.batch_progress")
    if progress is not None:
        for name in _LOOP_COUNTERS:
            done = progress["current"][name]
            regrouped = _whole(done * ratio, done, ratio)
            progress["total"][name] += regrouped - done
            progress["current"][name] = regrouped
    for node in (fit_loop.get("state_dict"), checkpoint.get("callbacks")):
        for position in _loader_positions(node):
            done = position["batches_done"]
            position["batches_done"] = _whole(done * ratio, done, ratio)


def _whole(value: Fraction, done: int, ratio: Fraction) -> int:
    if value.denominator != 1:
        raise ConfigError(
            f"ckpt_path: the checkpoint stopped after {done} batches of {ratio.numerator} "
            f"samples per {ratio.denominator}, which is no whole number of this run's batches; "
            "resume with the run's batch size (hw.batch_size) or from an epoch's end",
            ("ckpt_path",),
        )
    return int(value)


def _loader_positions(node: Any) -> list[dict[str, Any]]:
    """Every saved loader position (a dict with ``batches_done``) below ``node``."""
    if isinstance(node, dict):
        if "batches_done" in node:
            return [node]
        return [found for value in node.values() for found in _loader_positions(value)]
    if isinstance(node, list | tuple):
        return [found for value in node for found in _loader_positions(value)]
    return []


def apply_optimizer_setting(trainer: L.Trainer, key: str, old: Any, new: Any) -> None:
    """Set ``model.optimizer.<name>`` to ``new`` in every parameter group of every optimizer;
    the learning rate scales the current rate, ``initial_lr`` and the schedule's base rates by
    new / old, so a warm-up or decay goes on at the new peak. Raises `ConfigError` when the
    groups do not hold the setting."""
    name = key.removeprefix(OPTIMIZER_PREFIX)
    if name in _NOT_GROUP_SETTINGS:
        return
    groups = [group for optimizer in trainer.optimizers for group in optimizer.param_groups]
    if not groups or any(name not in group for group in groups) or new is None:
        raise ConfigError(
            f"{key}: {old} -> {new} cannot be applied on a resume (the optimizer's parameter "
            "groups hold no such setting); start a new run from the weights with "
            "init_from=<ckpt>",
            (key,),
        )
    if name == "lr":
        ratio = float(new) / float(old) if old else None
        for group in groups:
            group["lr"] = group["lr"] * ratio if ratio is not None else float(new)
            if "initial_lr" in group:
                group["initial_lr"] = float(new)
        for config in trainer.lr_scheduler_configs:
            base_lrs = getattr(config.scheduler, "base_lrs", None)
            if base_lrs is not None:
                config.scheduler.base_lrs = [float(new) for _ in base_lrs]
    else:
        value = tuple(new) if isinstance(new, list) else new
        for group in groups:
            group[name] = value
    log.warning("resume: applied %s: %s -> %s to the optimizer", key, old, new)


def apply_schedule(trainer: L.Trainer, pl_module: L.LightningModule) -> None:
    """Give every `WarmupDecayLR` of the run the module's schedule settings (warm-up, decay,
    power), which the checkpoint's scheduler state replaced, and set the rates it now gives.
    Raises `ConfigError` for a schedule of another kind (its state is the checkpoint's)."""
    schedule: WarmupDecaySchedule | None = getattr(pl_module, "lr_schedule", None)
    schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
    if schedule is None or not all(isinstance(s, WarmupDecayLR) for s in schedulers):
        raise ConfigError(
            "model.lr_schedule: a changed schedule cannot be applied on a resume of this module "
            "(its scheduler's state is the checkpoint's); start a new run from the weights with "
            "init_from=<ckpt>",
            ("model.lr_schedule",),
        )
    for scheduler in schedulers:
        scheduler.warmup_steps = schedule.warmup_for(scheduler.planned_steps)
        scheduler.decay = schedule.decay
        scheduler.poly_power = schedule.poly_power
        for group, rate in zip(scheduler.optimizer.param_groups, scheduler.get_lr(), strict=True):
            group["lr"] = rate
    log.warning("resume: applied model.lr_schedule (%s)", schedule)
