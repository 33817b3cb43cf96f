"""Write the topic-sentences corpus: short English sentences over four topics, and its tokenizer.

``python scripts/make_topic_sentences.py`` rewrites ``corpora/topic_sentences/`` (train.jsonl,
val.jsonl, tokenizer/) byte for byte: the sentences are a pure function of the word lists and
the seed below. Each sentence fills a template's three content slots from its topic's words,
but each slot takes a word of another topic with probability ``BORROW``; sentences whose
borrowed words outnumber their own are genuinely ambiguous, so no classifier reaches 100% and
calibration has something to measure. The words and templates were written for this project
and are released under CC0 1.0 (see the corpus README).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

from vramkit.tasks.text_classification.toy_data import save_word_tokenizer

LABELS = ("sport", "cooking", "weather", "computing")
NOUNS = {
    "sport": ("match", "goal", "coach", "team", "striker", "referee", "stadium", "league"),
    "cooking": ("soup", "oven", "recipe", "chef", "garlic", "pan", "dough", "sauce"),
    "weather": ("storm", "rain", "wind", "forecast", "cloud", "snow", "thunder", "fog"),
    "computing": ("server", "code", "laptop", "compiler", "kernel", "network", "disk", "bug"),
}
VERBS = {
    "sport": ("scored", "defended", "trained", "tackled"),
    "cooking": ("baked", "stirred", "seasoned", "roasted"),
    "weather": ("poured", "froze", "cleared", "drifted"),
    "computing": ("crashed", "compiled", "booted", "rebooted"),
}
ADJECTIVES = {
    "sport": ("offside", "athletic", "unbeaten"),
    "cooking": ("spicy", "crispy", "tender"),
    "weather": ("humid", "windy", "chilly"),
    "computing": ("digital", "encrypted", "buggy"),
}
TEMPLATES = (
    "the {adj} {noun} {verb} again",
    "our {noun} {verb} before the {noun2}",
    "a {adj} {noun} was {verb} today",
    "they said the {noun} {verb} near the {noun2}",
    "why is the {noun} so {adj}",
    "the {noun2} and the {noun} were {adj}",
)
NEUTRAL = ("the", "a", "our", "they", "said", "was", "were", "and", "before", "near", "why", "is")
NEUTRAL += ("so", "again", "today")
BORROW = 0.25  # chance that a content slot takes another topic's word
SPLITS = {"train.jsonl": 400, "val.jsonl": 200}
SEED = 2024


def sentence(rng: random.Random, label: int) -> str:
    """One sentence of topic ``label`` (with possibly borrowed words)."""

    def topic() -> str:
        if rng.random() < BORROW:
            return rng.choice([t for i, t in enumerate(LABELS) if i != label])
        return LABELS[label]

    return rng.choice(TEMPLATES).format(
        noun=rng.choice(NOUNS[topic()]),
        noun2=rng.choice(NOUNS[topic()]),
        verb=rng.choice(VERBS[topic()]),
        adj=rng.choice(ADJECTIVES[topic()]),
    )


def vocabulary() -> tuple[str, ...]:
    """Every word a sentence can contain."""
    words = set(NEUTRAL)
    for table in (NOUNS, VERBS, ADJECTIVES):
        for topic_words in table.values():
            words.update(topic_words)
    return tuple(sorted(words))


def write_corpus(folder: Path) -> None:
    """Write both splits (labels balanced, order shuffled) and the word tokenizer."""
    rng = random.Random(SEED)
    folder.mkdir(parents=True, exist_ok=True)
    for name, count in SPLITS.items():
        labels = [index % len(LABELS) for index in range(count)]
        rng.shuffle(labels)
        lines = [json.dumps({"text": sentence(rng, label), "label": label}) for label in labels]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    shutil.rmtree(folder / "tokenizer", ignore_errors=True)
    save_word_tokenizer(folder / "tokenizer", vocabulary())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / "corpora" / "topic_sentences"
    parser.add_argument("--out", type=Path, default=default, help="corpus folder to (re)write")
    args = parser.parse_args()
    write_corpus(args.out)
    print(f"wrote {args.out}: {SPLITS} sentences, {len(vocabulary()) + 2} tokens")


if __name__ == "__main__":
    main()
