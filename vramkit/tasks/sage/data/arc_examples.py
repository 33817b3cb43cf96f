"""ARC examples: a query pair with its task's other pairs as context, tokenised into tensors.

An example's *inputs* are the demonstration pairs and the query's input grid; its *answer* is the
query's output grid. :func:`example_inputs` never reads the answer, and the item dictionaries
keep the two apart by key (:data:`INPUT_KEYS` / :data:`TARGET_KEYS`), so a teacher given
``{k: batch[k] for k in INPUT_KEYS}`` cannot see it.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from vramkit.core.config.settings import Settings
from vramkit.tasks.sage.data.arc_tasks import ArcTask, Pair
from vramkit.tasks.sage.grids.grid_augment import GridTransform
from vramkit.tasks.sage.grids.grid_tokens import MAX_DEMOS, EncodedInput, encode_input, pad_grid

ContextMode = Literal["demos", "none"]
"""demos: demonstration pairs precede the query; none: the query grid alone."""
QueryMode = Literal["test", "all"]
"""test: a task's test pairs only; all: every pair in turn."""
CONTEXT_MODES = typing.get_args(ContextMode)
QUERY_MODES = typing.get_args(QueryMode)
# what a network may read; the answer is only in TARGET_KEYS
INPUT_KEYS = (
    "tokens",
    "rows",
    "cols",
    "roles",
    "pairs",
    "padding_mask",
    "query_index",
    "query_grid",
)
TARGET_KEYS = ("target", "target_size")


@dataclass(frozen=True)
class ArcExample:
    """A query pair of one task and the demonstration pairs shown with it."""

    key: str  # "<task id>/test<j>" or "<task id>/pair<k>": unique within a split
    task_id: str
    demos: tuple[Pair, ...]
    query_input: np.ndarray
    answer: np.ndarray

    def transformed(self, transform: GridTransform) -> ArcExample:
        """The same example with ``transform`` applied to every grid, answer included."""
        return ArcExample(
            key=self.key,
            task_id=self.task_id,
            demos=tuple((transform.apply(i), transform.apply(o)) for i, o in self.demos),
            query_input=transform.apply(self.query_input),
            answer=transform.apply(self.answer),
        )


def build_examples(tasks: Sequence[ArcTask], *, queries: str) -> list[ArcExample]:
    """Examples of ``tasks``: ``queries="test"`` takes every test pair with the demonstrations as
    context; ``"all"`` (for training tasks) takes every pair in turn, the task's other pairs
    (demonstrations and tests) as context."""
    if queries not in QUERY_MODES:
        raise ValueError(f"queries must be one of {QUERY_MODES}, got {queries!r}")
    examples = []
    for task in tasks:
        if queries == "test":
            for index, (grid_in, grid_out) in enumerate(task.test):
                examples.append(
                    ArcExample(
                        f"{task.task_id}/test{index}", task.task_id, task.train, grid_in, grid_out
                    )
                )
            continue
        pairs = (*task.train, *task.test)
        for index, (grid_in, grid_out) in enumerate(pairs):
            context = pairs[:index] + pairs[index + 1 :]
            examples.append(
                ArcExample(f"{task.task_id}/pair{index}", task.task_id, context, grid_in, grid_out)
            )
    return examples


class EncodingSettings(Settings):
    """How examples become sequences."""

    context: ContextMode = "demos"
    """demos: demonstration pairs as context; none: the query alone."""
    max_length: int = 1024
    """Tokens per sequence; demonstrations that do not fit are left out."""
    max_demos: int = MAX_DEMOS
    """Demonstration pairs per sequence at most."""


def example_inputs(example: ArcExample, settings: EncodingSettings) -> EncodedInput:
    """The example's token sequence; built from the demonstrations and query input only."""
    demos = example.demos if settings.context == "demos" else ()
    return encode_input(
        demos, example.query_input, max_length=settings.max_length, max_demos=settings.max_demos
    )


def example_item(example: ArcExample, settings: EncodingSettings) -> dict[str, torch.Tensor]:
    """One dataset item: the input sequence fields and the padded answer with its size."""
    encoded = example_inputs(example, settings)
    height, width = example.answer.shape
    return {
        "tokens": torch.from_numpy(encoded.tokens).long(),
        "rows": torch.from_numpy(encoded.rows).long(),
        "cols": torch.from_numpy(encoded.cols).long(),
        "roles": torch.from_numpy(encoded.roles).long(),
        "pairs": torch.from_numpy(encoded.pairs).long(),
        "query_index": torch.from_numpy(encoded.query_index).long(),
        "query_grid": torch.from_numpy(encoded.query_grid).long(),
        "target": torch.from_numpy(pad_grid(example.answer)).long(),
        "target_size": torch.tensor([height, width], dtype=torch.long),
    }
