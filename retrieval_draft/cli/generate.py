"""The ``generate`` subcommand of the ``retrieval-draft`` program (text in, text out).

The program itself (``retrieval_draft_datastore.cli``) adds the builder's
commands. Errors we raise on purpose print as one line (``error: ...``) with
exit code 2, and Ctrl-C ends any command with ``interrupted`` and exit code 130 (``run``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from retrieval_draft.config import DEFAULTS, check_setting
from retrieval_draft.drafters.registry import DRAFTERS, STORE_DRAFTERS, known_names
from retrieval_draft.errors import InvalidInputError, RetrievalDraftError

# generate's flags that set a drafting setting: (flag, argparse attribute, the setting), which
# ``config.check_setting`` checks by the rule and with the message the plugin's keyword gets.
_SETTING_FLAGS = (("--tree-budget", "tree_budget", "tree_budget"), ("--max-draft-len", "max_draft_len", "max_draft_len"),
                  ("--seed", "seed", "draft_seed"))
# generate's other numeric flags: (flag, argparse attribute, valid?, the rule in words); unset (None) is fine.
_NUMBER_RULES = (
    ("--max-new-tokens", "max_new_tokens", lambda v: v >= 1, "at least 1"),
    ("--temperature", "temperature", lambda v: 0 < v < math.inf, "a finite number above 0"),
    ("--top-k", "top_k", lambda v: v >= 1, "at least 1"),
    ("--top-p", "top_p", lambda v: 0 < v <= 1, "above 0 and at most 1"),
)


def add_generate(sub) -> None:
    """Register the ``generate`` subcommand on an argparse subparsers object."""
    gen = sub.add_parser("generate", help="generate text with tree-verified retrieval drafts")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the prompt text")
    source.add_argument("--prompt-file", help="read the prompt from this file")
    gen.add_argument("--model", default=None, help="local HF model directory, .gguf file, or smollm2-135m / gemma3-270m / "
                                                   "qwen2.5-coder-0.5b (default: smollm2-135m)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default: 128)")
    gen.add_argument(
        "--datastore", action="append", default=None,
        help="datastore directory built by `retrieval-draft build` or `repo`; repeat to draft from several "
        "(e.g. a repo store and a general store)",
    )
    gen.add_argument(
        "--drafters", default="all", help=f"comma list of {','.join(DRAFTERS)} or 'all' (the plugin's default menu: prompt, the datastores' "
        "drafters, history, recycle)"
    )
    gen.add_argument(
        "--history",
        default=None,
        help="output-history file (.npz): loaded when present, drafted from, and saved with this generation added",
    )
    gen.add_argument("--tree-budget", type=int, default=DEFAULTS.tree_budget, help="most draft nodes per verification tree")
    gen.add_argument("--fixed-tree", action="store_true", help="always verify --tree-budget nodes (no cost-aware sizing)")
    gen.add_argument("--max-draft-len", type=int, default=DEFAULTS.max_draft_len, help="deepest draft path in tokens")
    gen.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default: greedy)")
    gen.add_argument("--top-k", type=int, default=None, help="with --temperature: sample from the K likeliest tokens")
    gen.add_argument("--top-p", type=float, default=None,
                     help="with --temperature: sample from the likeliest tokens holding probability P (nucleus)")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed; the same seed gives the same output")
    gen.add_argument("--compare", action="store_true", help="also run plain HF generate and print both speeds")
    gen.set_defaults(func=run_generate)


def run(args: argparse.Namespace) -> int:
    """Run a parsed subcommand; errors we raise on purpose print as one line and return 2; a reader
    that stops early (``retrieval-draft stats S | head``) ends it quietly with 141, as SIGPIPE would;
    Ctrl-C prints ``interrupted`` and returns 130, as a shell reports SIGINT (each command writes its
    files atomically, so nothing is left half-written)."""
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone fails here, not in the interpreter's flush at exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141
    except RetrievalDraftError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def run_generate(args: argparse.Namespace) -> int:
    """Generate once (and, with --compare, side by side with plain HF generate)."""
    _check_numbers(args)
    _check_drafters(args)
    prompt = _prompt(args)
    if not prompt.strip():
        raise InvalidInputError("the prompt is empty")
    from retrieval_draft.model.models import model_location

    model_location(args.model)  # a missing model is refused before torch and transformers load (~7 s)
    from retrieval_draft.cli.compare import compare_with_plain
    from retrieval_draft.drafters.history import HistoryDrafter
    from retrieval_draft.sessions.session import GenerationRequest, load_session

    sampling = {k: v for k, v in (("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p)) if v is not None}
    drafters = args.drafters
    if args.history and drafters != "all" and "history" not in drafters.split(","):
        drafters += ",history"  # 'all' (the plugin's menu) drafts from the history already
    request = GenerationRequest(
        prompt=prompt,
        chat=args.chat,
        max_new_tokens=args.max_new_tokens,
        drafters=drafters,
        tree_budget=args.tree_budget,
        adaptive_tree=not args.fixed_tree,
        max_draft_len=args.max_draft_len,
        sampling=sampling,
        seed=args.seed,
    )
    if args.history and Path(args.history).exists():
        HistoryDrafter.load(args.history)  # a damaged file is refused before the model loads
    started = time.perf_counter()
    session = load_session(args.model, args.datastore)
    print(f"loaded model in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    if args.history and Path(args.history).exists():
        session.history = HistoryDrafter.load(
            args.history, vocab_size=session.model.config.vocab_size, tokenizer=session.tokenizer
        )
    if not args.compare:
        text, stats = session.generate(request, stream=True)
        print()
        print(_stats_line(stats.as_dict()), file=sys.stderr)
    else:
        report = compare_with_plain(session, request)
        print(report.text)
        print()
        print(report.table())
    if args.history:
        session.history.save(args.history, tokenizer=session.tokenizer)
    return 0


def _prompt(args: argparse.Namespace) -> str:
    """``--prompt``, or the text of the file ``--prompt-file`` names; InvalidInputError naming the
    flag and the path for a file that is missing, unreadable or not UTF-8 text."""
    if args.prompt is not None:
        return args.prompt
    try:
        return Path(args.prompt_file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInputError(f"--prompt-file {args.prompt_file}: no such file") from None
    except OSError as error:
        raise InvalidInputError(f"--prompt-file {args.prompt_file}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise InvalidInputError(f"--prompt-file {args.prompt_file}: not UTF-8 text") from None


def _check_numbers(args: argparse.Namespace) -> None:
    """Raise InvalidInputError for the first out-of-range number, before anything is loaded: a drafting
    setting by the config's check, its message after the flag ("--tree-budget: tree_budget must be an
    integer in 0..4096, got -1"), the others by ``_NUMBER_RULES``."""
    for flag, name, valid, rule in _NUMBER_RULES:
        value = getattr(args, name)
        if value is not None and not valid(value):
            raise InvalidInputError(f"{flag} must be {rule}, got {value}")
    for flag, name, setting in _SETTING_FLAGS:
        try:
            check_setting(setting, getattr(args, name))
        except InvalidInputError as error:
            raise InvalidInputError(f"{flag}: {error}") from None


def _check_drafters(args: argparse.Namespace) -> None:
    """InvalidInputError for an unknown ``--drafters`` name, or a store drafter with no ``--datastore``,
    before anything is loaded."""
    names = [name.strip() for name in args.drafters.split(",") if name.strip()]
    if names == ["all"]:
        return
    known_names(names)
    needs_store = [name for name in names if name in STORE_DRAFTERS]
    if needs_store and not args.datastore:
        raise InvalidInputError(f"--drafters {','.join(needs_store)} needs a datastore (--datastore DIR)")


def _stats_line(stats: dict) -> str:
    return (
        f"{stats['new_tokens']} tokens, {stats['decode_tokens_per_s']} tokens/s decode, "
        f"{stats['mean_accepted']} accepted per step, prefill {stats['prefill_s']} s"
    )
