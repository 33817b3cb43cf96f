"""A small two-class text set and its word-level tokenizer, written locally (nothing downloaded).

It lets ``task=text_classification`` run and be planned on a fresh machine: each text mixes
neutral words with words of one sentiment, and the label says which (0 negative, 1 positive).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from vramkit.core.config.settings import Settings
from vramkit.core.optional_dependency import import_optional

NEGATIVE = ("bad", "awful", "poor", "sad", "dark", "angry", "broken", "slow")
POSITIVE = ("good", "great", "fine", "happy", "bright", "calm", "kind", "fast")
NEUTRAL = ("the", "a", "day", "film", "meal", "room", "was", "and", "very", "quite", "it", "our")
PAD, UNK = "[PAD]", "[UNK]"  # ids 0 and 1


class ToyTextConfig(Settings):
    """Sizes of the toy set (``data.toy``); the files are a pure function of these values."""

    num_train: int = Field(256, ge=1)
    """Training texts."""
    num_val: int = Field(64, ge=1)
    """Validation texts."""
    seed: int = Field(0, ge=0)
    """Random seed of the texts."""


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
