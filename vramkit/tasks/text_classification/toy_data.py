"""A small two-class text set and its word-level tokenizer, written locally (nothing downloaded).

It lets ``task=text_classification`` run and be planned on a fresh machine: each text mixes
neutral words with words of one sentiment, and the label says which (0 negative, 1 positive).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from vramkit.core.optional_dependency import import_optional

NEGATIVE = ("bad", "awful", "poor", "sad", "dark", "angry", "broken", "slow")
POSITIVE = ("good", "great", "fine", "happy", "bright", "calm", "kind", "fast")
NEUTRAL = ("the", "a", "day", "film", "meal", "room", "was", "and", "very", "quite", "it", "our")
PAD, UNK = "[PAD]", "[UNK]"  # ids 0 and 1


@dataclass(frozen=True)
class ToyTextConfig:
    """Sizes of the toy set; the files are a pure function of these values."""

    num_train: int = 256  # training texts
    num_val: int = 64  # validation texts
    seed: int = 0  # random seed of the texts

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"data.toy.{name} must be an integer >= 0, got {value!r}")
        if self.num_train < 1 or self.num_val < 1:
            raise ValueError("data.toy.num_train and data.toy.num_val must be >= 1")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ToyTextConfig:
        """Build it from the ``data.toy`` config node, refusing keys it does not know."""
        known = [field.name for field in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"data.toy.{unknown[0]} is not an option (known: {', '.join(known)})")
        return cls(**values)


@dataclass(frozen=True)
class ToyTextFiles:
    """Where the toy set lives: the two JSONL splits and the tokenizer folder."""

    train_file: Path
    val_file: Path
    tokenizer_dir: Path


def toy_text_files(root: Path, config: ToyTextConfig) -> ToyTextFiles:
    """The paths of the toy set for ``config`` below ``root`` (written or not)."""
    folder = Path(root) / f"toy_{config.num_train}_{config.num_val}_{config.seed}"
    return ToyTextFiles(folder / "train.jsonl", folder / "val.jsonl", folder / "tokenizer")


def ensure_toy_text_classification(root: Path, config: ToyTextConfig) -> ToyTextFiles:
    """Write the toy set below ``root`` unless it is there; return its paths.

    The folder appears complete or not at all (written aside, then renamed), so concurrent
    runs and loader workers never read half a file.
    """
    files = toy_text_files(root, config)
    folder = files.train_file.parent
    if folder.is_dir():
        return files
    staging = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    rng = random.Random(config.seed)
    for name, count in (("train.jsonl", config.num_train), ("val.jsonl", config.num_val)):
        lines = [json.dumps(_example(rng)) for _ in range(count)]
        (staging / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    save_word_tokenizer(staging / "tokenizer", (*NEGATIVE, *POSITIVE, *NEUTRAL))
    try:
        staging.rename(folder)
    except OSError:
        # Another process finished first; its files are the same.
        shutil.rmtree(staging, ignore_errors=True)
    return files


def save_word_tokenizer(folder: Path, words: tuple[str, ...]) -> None:
    """Save a whitespace word-level tokenizer over ``words`` (plus [PAD]=0, [UNK]=1) that
    ``AutoTokenizer.from_pretrained(folder)`` loads."""
    tokenizers = import_optional("tokenizers", extra="nlp", purpose="the toy text tokenizer")
    transformers = import_optional("transformers", extra="nlp", purpose="the toy text tokenizer")
    vocab = {token: index for index, token in enumerate((PAD, UNK, *sorted(set(words))))}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, unk_token=UNK
    )
    wrapped.save_pretrained(str(folder))


def _example(rng: random.Random) -> dict[str, object]:
    label = rng.randrange(2)
    mood = POSITIVE if label else NEGATIVE
    words = [rng.choice(NEUTRAL) for _ in range(rng.randint(3, 9))]
    for _ in range(rng.randint(1, 3)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(mood))
    return {"text": " ".join(words), "label": label}
