"""Write the instruction-pairs corpus: short prompts with their responses, and its tokenizer.

``python scripts/make_instruction_pairs.py`` rewrites ``corpora/instruction_pairs/``
(train.jsonl, val.jsonl, tokenizer/) byte for byte: the pairs are a pure function of the word
lists, the templates and the seed below. Each line is ``{"prompt": str, "response": str}``;
every response follows from its prompt by a simple rule (a sum, a successor, an opposite, a
colour, a comparison, a repetition), so a model that learns the rules lowers the response loss
well below that of one that only learnt the words. Words are separated by spaces, punctuation
included, so the word-level tokenizer covers every token. Written for vramkit and released
under CC0 1.0 (see the corpus README).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

from vramkit.tasks.causal_lm.word_tokenizer import save_word_tokenizer

NUMBERS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
OPPOSITES = {
    "hot": "cold",
    "big": "small",
    "fast": "slow",
    "up": "down",
    "day": "night",
    "open": "closed",
    "happy": "sad",
    "early": "late",
    "light": "dark",
    "old": "new",
}
COLOURS = {
    "sky": "blue",
    "grass": "green",
    "snow": "white",
    "coal": "black",
    "sun": "yellow",
    "tomato": "red",
    "carrot": "orange",
    "plum": "purple",
}
SPLITS = {"train.jsonl": 320, "val.jsonl": 80}
SEED = 33


def _pair(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(6)
    if kind == 0:
        a, b = rng.randrange(11), rng.randrange(11)
        return (
            f"what is {NUMBERS[a]} plus {NUMBERS[b]} ?",
            f"{NUMBERS[a]} plus {NUMBERS[b]} is {NUMBERS[a + b]} .",
        )
    if kind == 1:
        n = rng.randrange(20)
        return f"what comes after {NUMBERS[n]} ?", f"after {NUMBERS[n]} comes {NUMBERS[n + 1]} ."
    if kind == 2:
        word, opposite = rng.choice(sorted(OPPOSITES.items()))
        if rng.random() < 0.5:
            word, opposite = opposite, word
        return f"what is the opposite of {word} ?", f"the opposite of {word} is {opposite} ."
    if kind == 3:
        thing, colour = rng.choice(sorted(COLOURS.items()))
        return f"what colour is the {thing} ?", f"the {thing} is {colour} ."
    if kind == 4:
        a, b = rng.sample(range(21), 2)
        answer = "yes" if a > b else "no"
        relation = "bigger" if a > b else "smaller"
        return (
            f"is {NUMBERS[a]} bigger than {NUMBERS[b]} ?",
            f"{answer} , {NUMBERS[a]} is {relation} than {NUMBERS[b]} .",
        )
    word = rng.choice([*OPPOSITES, *COLOURS.values()])
    times = rng.randint(2, 4)
    return f"say {word} {NUMBERS[times]} times .", " ".join([word] * times) + " ."


def vocabulary() -> tuple[str, ...]:
    """Every word the templates can write."""
    words = set(NUMBERS) | set(OPPOSITES) | set(OPPOSITES.values())
    words |= set(COLOURS) | set(COLOURS.values())
    words |= set(
        [
            "what",
            "is",
            "plus",
            "?",
            "comes",
            "after",
            "the",
            "opposite",
            "of",
            "colour",
            "bigger",
            "than",
            "smaller",
            "yes",
            "no",
            ",",
            ".",
            "say",
            "times",
        ]
    )
    return tuple(sorted(words))


def write_corpus(folder: Path) -> None:
    """(Re)write the corpus and its tokenizer in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    for name, count in SPLITS.items():
        pairs = [_pair(rng) for _ in range(count)]
        lines = [json.dumps({"prompt": prompt, "response": response}) for prompt, response in pairs]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    shutil.rmtree(folder / "tokenizer", ignore_errors=True)
    save_word_tokenizer(folder / "tokenizer", vocabulary())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / "corpora" / "instruction_pairs"
    parser.add_argument("--out", type=Path, default=default, help="corpus folder to (re)write")
    args = parser.parse_args()
    write_corpus(args.out)
    print(f"wrote {args.out}: {SPLITS} pairs, {len(vocabulary()) + 4} tokens")


if __name__ == "__main__":
    main()
