"""Shared helpers for the datastore tests: tiny in-process tokenizers and corpora."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

STDLIB_FILES = ("bisect.py", "colorsys.py", "keyword.py", "heapq.py", "fnmatch.py")


def word_tokenizer(words: list[str], extra: int = 0) -> PreTrainedTokenizerFast:
    """A fast WordLevel tokenizer over ``words`` (+ ``extra`` filler words), whitespace split."""
    vocab = {"[UNK]": 0}
    for word in list(words) + [f"w{i}" for i in range(extra)]:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def bpe_tokenizer(texts: list[str], vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer trained on ``texts`` in a fraction of a second."""
    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def stdlib_corpus(target: Path) -> Path:
    """Copy a few small stdlib modules into ``target`` (a directory of .py files); returns it."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    target.mkdir(parents=True, exist_ok=True)
    for name in STDLIB_FILES:
        (target / name).write_text((stdlib / name).read_text(encoding="utf-8"), encoding="utf-8")
    return target


def cli(argv: list[str]) -> int:
    """Run the datastore subcommands through a throwaway argparse parser; returns the exit code."""
    import argparse

    from retrieval_draft_datastore.commands import register

    parser = argparse.ArgumentParser(prog="retrieval-draft")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
