"""ARC data settings and the datasets both SAGE datamodules build on.

- :class:`ArcDataSettings`: which sets, which queries, how sequences are built, which
  augmentations (validated, with the config key in every message).
- :class:`ArcAugmentedDataset`: examples with a fresh random transform at every access (the
  teacher's training data).
- :class:`ArcViewDataset`: every fixed augmented view of every example, ``item = example ×
  views + view`` (what the feature cache stores, and what the student reads with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch.utils.data import Dataset

from vramkit.core.config.settings import Settings
from vramkit.tasks.sage.data.arc_examples import (
    ArcExample,
    ContextMode,
    EncodingSettings,
    QueryMode,
    build_examples,
    example_inputs,
    example_item,
)
from vramkit.tasks.sage.data.arc_tasks import load_arc_split
from vramkit.tasks.sage.grids.grid_augment import random_transform, view_transform
from vramkit.tasks.sage.grids.grid_tokens import MAX_DEMOS, MIN_SEQUENCE_LENGTH


class AugmentSettings(Settings):
    """Which augmentation families are drawn from (each applied to a whole example)."""

    dihedral: bool = True
    """The 8 rotations/reflections of the square."""
    colours: bool = True
    """Permutations of colours 1–9 (0, the background, stays)."""


class ArcDataSettings(Settings):
    """What a SAGE run trains and validates on (``data.*`` keys); checked on construction."""

    train_set: str = "arc_agi_1/training"
    """Training tasks, ``<source>/<split>`` (arc_agi_1|arc_agi_2 / training|evaluation)."""
    val_set: str = "arc_agi_1/evaluation"
    """Held-out tasks; never a task of ``train_set``."""

    limit_tasks: int | None = Field(None, ge=1)
    """Only the first N tasks of each set (debugging and tests); null: all."""
    train_queries: QueryMode = "all"
    """Queries: ``test``, a task's test pairs only; ``all``, every pair in turn."""
    context: ContextMode = "demos"
    """``demos``: demonstration pairs precede the query; ``none``: the query grid alone."""
    max_length: int = Field(1024, ge=MIN_SEQUENCE_LENGTH)
    """Tokens per sequence; demonstrations that do not fit are dropped."""
    max_demos: int = Field(MAX_DEMOS, ge=0, le=MAX_DEMOS)
    """Demonstration pairs per sequence at most."""
    augment: AugmentSettings = Field(default_factory=AugmentSettings)
    """Augmentations drawn afresh for every training example."""

    @property
    def encoding(self) -> EncodingSettings:
        return EncodingSettings(
            context=self.context, max_length=self.max_length, max_demos=self.max_demos
        )

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump()


def load_examples(settings: ArcDataSettings) -> tuple[list[ArcExample], list[ArcExample]]:
    """Training examples (``train_queries``) and validation examples (test pairs), by task."""
    split = load_arc_split(settings.train_set, settings.val_set, limit_tasks=settings.limit_tasks)
    return (
        build_examples(split.train, queries=settings.train_queries),
        build_examples(split.held_out, queries="test"),
    )


class ArcAugmentedDataset(Dataset):
    """Examples, each drawn with a new random whole-example transform (or none)."""

    def __init__(
        self,
        examples: Sequence[ArcExample],
        encoding: EncodingSettings,
        augment: AugmentSettings | None,
    ) -> None:
        self.examples = list(examples)
        self.encoding = encoding
        self.augment = augment
        self.lengths = [len(example_inputs(e, encoding)) for e in self.examples]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        example = self.examples[index]
        if self.augment is not None:
            # the training loader seeds torch's generator per sample (SeededSamples), so an
            # example's transform is the same with any number of workers and after a resume
            rng = np.random.default_rng(int(torch.randint(2**62, ())))
            transform = random_transform(
                rng, dihedral=self.augment.dihedral, colours=self.augment.colours
            )
            example = example.transformed(transform)
        return example_item(example, self.encoding)


class ArcViewDataset(Dataset):
    """Every view of every example; view 0 is the original, the others fixed random transforms.

    ``views[item]`` is a pure function of the example key, the view and ``view_seed``;
    ``views`` ≥ 1 (``data.views``, checked by the datamodule).
    """

    def __init__(
        self,
        examples: Sequence[ArcExample],
        encoding: EncodingSettings,
        *,
        views: int,
        view_seed: int,
        augment: AugmentSettings,
    ) -> None:
        self.examples = list(examples)
        self.encoding = encoding
        self.views = views
        self.view_seed = view_seed
        self.augment = augment
        self.lengths = [len(example_inputs(self.example(i), encoding)) for i in range(len(self))]

    def __len__(self) -> int:
        return len(self.examples) * self.views

    def example(self, item: int) -> ArcExample:
        """The (transformed) example of ``item``."""
        example = self.examples[item // self.views]
        transform = view_transform(
            example.key,
            item % self.views,
            seed=self.view_seed,
            dihedral=self.augment.dihedral,
            colours=self.augment.colours,
        )
        return example if transform.is_identity else example.transformed(transform)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        return {**example_item(self.example(item), self.encoding), "item": torch.tensor(item)}
