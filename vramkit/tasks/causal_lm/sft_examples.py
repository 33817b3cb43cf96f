"""Prompt/response pairs from JSON Lines, tokenized for supervised fine-tuning.

Each line is ``{"prompt": str, "response": str}``. A tokenized example is the begin token, the
formatted prompt, the response and the end token; its labels are the token ids on the response
and the end token and -100 on the rest, so the loss is the response's alone (as TRL's
completion-only training and Alpaca's preprocessing mask the prompt). The prompt and the
response are tokenized apart and joined, so the boundary never merges a prompt token with a
response token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramkit.core.data.bad_lines import AnnotationError, BadLine

IGNORE_INDEX = -100
"""A label the loss ignores (PyTorch's ``cross_entropy`` default ``ignore_index``)."""


@dataclass(frozen=True)
class PromptResponse:
    """One example as written in the file."""

    prompt: str
    response: str


@dataclass(frozen=True)
class TokenizedExample:
    """One example as token ids and labels of the same length (-100 on the prompt)."""

    input_ids: list[int]
    labels: list[int]


def read_pairs(path: Path, *, strict: bool) -> tuple[list[PromptResponse], list[BadLine]]:
    """The pairs of a JSONL file, and its lines that are not pairs (blank lines are ignored).

    A bad line raises :class:`AnnotationError` naming file and line when ``strict``; otherwise
    it is returned in the second list and the rest is read.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise FileNotFoundError(f"cannot read the JSONL file {path}: {error}") from None
    except UnicodeDecodeError as error:
        raise AnnotationError(f"{path}: not UTF-8 text ({error})") from None
    pairs: list[PromptResponse] = []
    bad: list[BadLine] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        pair, reason = _parse(line)
        if pair is not None:
            pairs.append(pair)
            continue
        problem = BadLine(Path(path), number, reason)
        if strict:
            raise AnnotationError(str(problem))
        bad.append(problem)
    return pairs, bad


def _parse(line: str) -> tuple[PromptResponse | None, str]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        return None, f"not JSON ({error.msg} at column {error.colno})"
    if not isinstance(record, dict):
        return None, f"expected an object with 'prompt' and 'response', got {type(record).__name__}"
    for key in ("prompt", "response"):
        if not isinstance(record.get(key), str):
            return None, f"{key!r} must be a string, got {record.get(key)!r}"
    return PromptResponse(record["prompt"], record["response"]), ""


def tokenize_example(tokenizer: Any, pair: PromptResponse, prompt_format: str) -> TokenizedExample:
    """``<bos> prompt response <eos>`` as ids, labelled on the response and ``<eos>`` only.

    ``prompt_format`` wraps the prompt (``"{prompt}"``, or a chat template such as
    ``"### Question: {prompt}\\n### Answer: "``). A tokenizer without a begin or end token
    goes without it.
    """
    prompt = tokenizer(prompt_format.format(prompt=pair.prompt), add_special_tokens=False)
    response = tokenizer(pair.response, add_special_tokens=False)
    head = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    tail = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    prompt_ids = head + list(prompt["input_ids"])
    response_ids = list(response["input_ids"]) + tail
    return TokenizedExample(
        input_ids=prompt_ids + response_ids,
        labels=[IGNORE_INDEX] * len(prompt_ids) + response_ids,
    )
