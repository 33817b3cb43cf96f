"""A whitespace word-level tokenizer with padding, unknown, begin and end tokens, saved locally.

The shipped instruction corpus (``corpora/instruction_pairs``) comes with one, so the tiny
experiments run without a download; any ``AutoTokenizer`` folder can replace it.
"""

from __future__ import annotations

from pathlib import Path

from vramkit.core.optional_dependency import import_optional

PAD, UNK, BOS, EOS = "[PAD]", "[UNK]", "<s>", "</s>"
"""Special tokens, ids 0 to 3 in this order."""


def save_word_tokenizer(folder: Path, words: tuple[str, ...]) -> None:
    """Save a tokenizer over ``words`` (after the four special tokens) that
    ``AutoTokenizer.from_pretrained(folder)`` loads; its ids are stable for the same words."""
    tokenizers = import_optional("tokenizers", extra="nlp", purpose="the word tokenizer")
    transformers = import_optional("transformers", extra="nlp", purpose="the word tokenizer")
    specials = (PAD, UNK, BOS, EOS)
    ordered = (*specials, *sorted(set(words) - set(specials)))
    vocab = {token: index for index, token in enumerate(ordered)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, unk_token=UNK, bos_token=BOS, eos_token=EOS
    )
    wrapped.save_pretrained(str(folder))
