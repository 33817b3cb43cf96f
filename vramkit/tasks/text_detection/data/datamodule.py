"""The LightningDataModule of text detection: ICDAR-layout folders or the synthetic dataset."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cv2
import lightning as L
from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import Field
from torch.utils.data import DataLoader

from vramkit.core.config.settings import ConfigPath
from vramkit.core.data.loaders import LoaderSettings, build_loader
from vramkit.core.io.disk_cache import ValidationCacheSettings
from vramkit.tasks.text_detection.data.augment import build_train_transform, build_val_transform
from vramkit.tasks.text_detection.data.device_inputs import to_model_inputs
from vramkit.tasks.text_detection.data.icdar_folder import (
    TextDetectionDataset,
    collate_text_detection,
    layout_problem,
)
from vramkit.tasks.text_detection.data.synthetic_text import (
    SyntheticTextConfig,
    ensure_synthetic_dataset,
)
from vramkit.tasks.text_detection.data.targets import make_targets

log = logging.getLogger(__name__)

# Network strides: DBNet's feature pyramid needs sides divisible by 32.
SIDE_MULTIPLE = 32


def _keyword_options(function: Any, *, exclude: tuple[str, ...] = ()) -> set[str]:
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in exclude
    }


def _plain(value: Any) -> Any:
    """Hydra containers → plain dicts and tuples (the dataclasses and pickling want those)."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return tuple(_plain(item) for item in value)
    return value


def _options(value: Any, key: str, known: set[str], owner: str) -> dict[str, Any]:
    if value is None:
        return {}
    value = _plain(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} must be a mapping of {owner} options, got {value!r}")
    for name in value:
        if name not in known:
            raise ValueError(
                f"{key}.{name} is not an option of {owner} (known: {', '.join(sorted(known))})"
            )
    return dict(value)


class TextDetectionDataSettings(LoaderSettings):
    """The ``data.*`` keys of text detection, as :class:`TextDetectionDataModule` takes them."""

    train_dir: ConfigPath | None = None
    """Training folder in ICDAR 2015 layout (images/, gt/); null with ``synthetic``."""
    val_dir: ConfigPath | None = None
    """Validation folder in ICDAR 2015 layout; null with ``synthetic``."""
    synthetic: SyntheticTextConfig | None = None
    """Parameters of the synthetic dataset, rendered once under ``data_root``; null for folders."""
    data_root: ConfigPath = Path("data")
    """Where generated datasets live."""
    image_size: int = Field(640, gt=0, multiple_of=SIDE_MULTIPLE)
    """Training crop side (px)."""
    val_image_size: int = Field(640, gt=0, multiple_of=SIDE_MULTIPLE)
    """Side validation images are resized to (px)."""
    channels_last: bool = False
    """Float images made in NHWC (channels last), the layout of a network built with
    ``model.channels_last``: the conversion writes them that way at no extra cost, where a
    network handed NCHW images copies them into NHWC first."""
    prefetch_factor: int | None = Field(None, gt=0)
    """Batches each loader worker prepares ahead; null: PyTorch's default (2)."""
    strict: bool = False
    """True: a corrupt image or malformed annotation line stops the run."""
    augment: dict[str, Any] | None = None
    """Options of :func:`build_train_transform`."""
    targets: dict[str, Any] | None = None
    """Options of :func:`make_targets`."""
    val_cache: ValidationCacheSettings | None = None
    """Validation inputs and targets kept on disk; null: recomputed on every pass."""

    def cross_field_problems(self) -> list[tuple[str, str]]:
        """Either ``synthetic`` or two folders with usable items give the data (run by the config
        checks)."""
        if self.synthetic is not None:
            return [
                (key, f"must be null when data.synthetic is set, got '{folder}'")
                for key, folder in (("train_dir", self.train_dir), ("val_dir", self.val_dir))
                if folder is not None
            ]
        problems = []
        for key, folder in (("train_dir", self.train_dir), ("val_dir", self.val_dir)):
            if folder is None:
                problems.append((key, "missing: a folder (images/, gt/), or set data.synthetic"))
            elif not folder.is_dir():
                problems.append((key, f"does not exist or is not a folder: {folder}"))
            elif (problem := layout_problem(folder)) is not None:
                problems.append((key, problem))
        return problems


class TextDetectionDataModule(L.LightningDataModule):
    """Training and validation loaders for DBNet.

    Either ``synthetic`` (fields of :class:`SyntheticTextConfig`; the dataset is rendered once
    under ``data_root``) or both ``train_dir`` and ``val_dir`` (ICDAR 2015 layout) give the data.
    Training images are augmented and cropped to ``image_size`` px; validation images are resized
    to ``val_image_size`` px and keep their original annotations for the ICDAR evaluation.
    ``augment`` holds options of :func:`build_train_transform`, ``targets`` options of
    :func:`make_targets`. A batch whose images were all unreadable holds only ``skipped``.

    ``val_cache`` ({enabled, dir, max_gib}) keeps the validation inputs and targets on disk
    (:mod:`vramkit.core.io.disk_cache`), so each is computed once across epochs and runs;
    training samples are always computed afresh in the workers. ``prefetch_factor`` is the
    number of batches each worker prepares ahead (None: PyTorch's default, 2).

    Its keys are the fields of `TextDetectionDataSettings`, given as keyword arguments and kept
    validated in ``self.settings``; ``train_dir`` and ``val_dir`` are also attributes, which a
    rendered synthetic set fills in.
    """

    settings_class = TextDetectionDataSettings

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        self.settings = TextDetectionDataSettings.for_component(type(self), settings)
        settings = self.settings
        # With synthetic data, the folders are known once the dataset is rendered.
        self.train_dir = settings.train_dir
        self.val_dir = settings.val_dir
        rendered = settings.synthetic is not None
        self._from_synthetic = rendered and None in (self.train_dir, self.val_dir)
        self._checked_synthetic = False  # every file checked against the manifest

        augment_options = _options(
            settings.augment,
            "data.augment",
            _keyword_options(build_train_transform),
            "build_train_transform",
        )
        self.target_params = _options(
            settings.targets, "data.targets", _keyword_options(make_targets), "make_targets"
        )
        try:
            self.train_transform = build_train_transform(
                self.settings.image_size, **augment_options
            )
        except (TypeError, ValueError) as error:
            raise ValueError(f"data.augment: {error}") from None
        self.val_transform = build_val_transform(self.settings.val_image_size)
        self.val_cache = None if settings.val_cache is None else settings.val_cache.build()
        self.train_dataset: TextDetectionDataset | None = None
        self.val_dataset: TextDetectionDataset | None = None

    def prepare_data(self) -> None:
        """Render the synthetic dataset if it is configured and not on disk yet."""
        self._resolve_synthetic_dirs()

    def _resolve_synthetic_dirs(self, *, checksums: bool = True) -> None:
        """Render the synthetic dataset when it is missing; `checksums` also checks (and
        repairs) every file, which a run needs and a plan, reading one item per split, does
        not (0.2-0.3 s for the default 2,200 files)."""
        if not self._from_synthetic or self._checked_synthetic:
            return
        if self.train_dir is not None and not checksums:
            return  # rendered already
        assert self.settings.synthetic is not None
        dataset_dir = ensure_synthetic_dataset(
            self.settings.data_root, self.settings.synthetic, checksums=checksums
        )
        self.train_dir = dataset_dir / "train"
        self.val_dir = dataset_dir / "val"
        self._checked_synthetic = checksums

    def setup(self, stage: str | None = None) -> None:
        """Index the splits (parse every annotation file once); later calls reuse them."""
        self._index_splits(stage, check_on_access=False)

    def setup_for_planning(self) -> None:
        """Both splits at full length, each annotation file parsed and checked when its item is
        first read, a synthetic dataset rendered if missing but its files' checksums left to the
        run: the memory planner reads one item per split (`PlanningSetup`)."""
        self._index_splits("fit", check_on_access=True)

    def _index_splits(self, stage: str | None, *, check_on_access: bool) -> None:
        # Also on ranks and in processes where prepare_data did not run; cheap when done. A
        # plan (`check_on_access`) renders a missing dataset but leaves the checksums to the run.
        self._resolve_synthetic_dirs(checksums=not check_on_access)

        def missing(dataset: TextDetectionDataset | None) -> bool:
            # A split indexed for planning is indexed again, in full, for a run.
            return dataset is None or (dataset.check_on_access and not check_on_access)

        if missing(self.train_dataset) and stage in (None, "fit"):
            self.train_dataset = TextDetectionDataset(
                self.train_dir,
                self.train_transform,
                strict=self.settings.strict,
                target_params=self.target_params,
                keep_annotations=False,
                check_on_access=check_on_access,
            )
        if missing(self.val_dataset):
            self.val_dataset = TextDetectionDataset(
                self.val_dir,
                self.val_transform,
                strict=self.settings.strict,
                target_params=self.target_params,
                keep_annotations=True,
                cache=self.val_cache,
                # what the validation transform depends on (build_val_transform)
                cache_params={"resize_px": self.settings.val_image_size},
                check_on_access=check_on_access,
            )

    def _loader(self, dataset: TextDetectionDataset, batch_size: int, *, train: bool) -> DataLoader:
        if self.settings.num_workers > 0:
            # Loader workers are forked from this process. A worker that inherits OpenCV's
            # thread pool (started here by in-process rendering or post-processing) deadlocks
            # as soon as it resizes or stops that pool, so the pool is stopped here, before any
            # fork: workers then run OpenCV on one thread each, as they should beside each other.
            cv2.setNumThreads(1)
        return build_loader(
            dataset,
            batch_size=batch_size,
            shuffle=train,
            # A short last batch makes noisy BatchNorm statistics; kept when it is the only one.
            drop_last=train and len(dataset) >= batch_size,
            num_workers=self.settings.num_workers,
            pin_memory=self.settings.pin_memory,
            persistent_workers=self.settings.persistent_workers,
            prefetch_factor=self.settings.prefetch_factor,
            collate_fn=collate_text_detection,
        )

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise RuntimeError("call setup('fit') before train_dataloader()")
        return self._loader(self.train_dataset, self.settings.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        if self.val_dataset is None:
            raise RuntimeError("call setup() before val_dataloader()")
        return self._loader(self.val_dataset, self.settings.val_batch_size, train=False)

    def predict_dataloader(self) -> DataLoader:
        """The validation split, in order: what ``eval.py`` writes submission files for."""
        return self.val_dataloader()

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Float model inputs from the compact uint8 batch, made on the device.

        Lightning casts inputs for `*-true` precisions before the transfer, when the image is
        still uint8; the same cast is applied here to what the conversion made. Validation
        computes no loss: its target maps stay as loaded. Converting them took 22-23 of the
        26.7-27.3 ms of CPU that a batch of 16 images of 320 px cost here (one thread, medians of
        15, ``time.thread_time``), about 5% of the default task's validation pass.
        """
        trainer = self.trainer
        evaluating = trainer is not None and (trainer.validating or trainer.sanity_checking)
        batch = to_model_inputs(
            batch, maps=not evaluating, channels_last=self.settings.channels_last
        )
        if trainer is not None:
            batch = trainer.precision_plugin.convert_input(batch)
        return batch

    def teardown(self, stage: str) -> None:
        """Log the validation cache's storage report at the end of a run."""
        if self.val_cache is not None and self.val_dataset is not None:
            log.info("validation cache: %s", self.val_cache.report().describe())

    def data_problems(self) -> dict[str, int]:
        """Input problems found while indexing, by ``<split>/<kind>`` (bad_lines, missing_gt…)."""
        problems = {}
        for split, dataset in (("train", self.train_dataset), ("val", self.val_dataset)):
            if dataset is not None:
                for kind, count in dataset.problems().items():
                    problems[f"{split}/{kind}"] = count
        return problems
