"""Check the Hub route's folder against the installed transformers, on a tiny random model.

    python -m tools.hub_check [--folder hub/retrieval-draft] [--max-new-tokens 24]      (make hub-check)

Loads ``custom_generate/generate.py`` from the folder by path, as
``model.generate(custom_generate=FOLDER, trust_remote_code=True)`` does, and runs it on a
2-layer Llama with random weights built from a config (no download, a few seconds on CPU):

- ``requirements``: every line of ``custom_generate/requirements.txt`` and its installed version;
- ``load``: transformers' loader (which also compares those versions) returns the folder's ``generate``
  (the installed package's ``retrieval_draft.serving.hub_route.generate``);
- ``greedy``: the folder's output equals plain greedy ``generate`` on a few prompts;
- ``streamer``: an HF streamer given as ``streamer=`` receives what plain greedy ``generate``
  streams: the prompt, every new token once and in order, then one ``end()``;
- ``options``: our keyword arguments reach the engine (``draft_stats=`` is filled).

Prints one line per check and exits 0 when all pass, 1 otherwise. Trees are fixed-size
(``adaptive_tree=False``) and nothing is learned across calls, so no cost curve is measured.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
from pathlib import Path

import torch

FOLDER = Path(__file__).resolve().parents[1] / "hub" / "retrieval-draft"
OPTIONS = {"adaptive_tree": False, "draft_learning": False, "tree_budget": 16}


class RecordingStreamer:
    """An HF streamer (``put``/``end``) that keeps what it receives: ids per ``put``, and ``end`` calls."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ends = 0
        self.put_after_end = False

    def put(self, value: torch.Tensor) -> None:
        self.put_after_end |= self.ends > 0
        self.puts.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ends += 1

    def summary(self) -> tuple:
        """(first put's ids, later puts' ids joined, ``end`` calls, whether a ``put`` followed an ``end``)."""
        first = self.puts[0] if self.puts else []
        return first, [token for ids in self.puts[1:] for token in ids], self.ends, self.put_after_end


def tiny_llama():
    """A 2-layer Llama with random weights (vocabulary 320, EOS id 2, pad id 0), eval mode, SDPA."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = 0
    return model


def prompts() -> list[torch.Tensor]:
    """Shape (1, L) prompts of ids in [3, 320): one random, one a repeated block (prompt lookup drafts)."""
    generator = torch.Generator().manual_seed(0)
    block = torch.randint(3, 320, (12,), generator=generator)
    return [torch.randint(3, 320, (20,), generator=generator)[None], block.repeat(3)[None]]


def installed(name: str) -> str | None:
    """The installed version of distribution ``name``, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_requirements(folder: Path) -> tuple[bool, str]:
    """Each requirement line with its installed version; fails when a named package is missing."""
    lines = (folder / "custom_generate" / "requirements.txt").read_text().splitlines()
    found = {line: installed(re.match(r"[A-Za-z0-9_.-]+", line).group(0))
             for line in map(str.strip, lines) if line and not line.startswith("#")}
    detail = "; ".join(f"{line} (installed {version})" for line, version in found.items())
    return all(found.values()), detail


def check_load(model, folder: Path) -> tuple[bool, str]:
    """transformers' own loader returns the folder's ``generate``: the installed package's
    ``retrieval_draft.serving.hub_route.generate``, which ``custom_generate/generate.py`` imports."""
    from retrieval_draft.serving.hub_route import generate

    function = model.load_custom_generate(str(folder), trust_remote_code=True)
    source = Path(function.__code__.co_filename)
    return function is generate, f"{function.__module__} from {source}"


def check_greedy(model, folder: Path, max_new_tokens: int) -> tuple[bool, str]:
    """The folder's output equals plain greedy ``generate``'s on every prompt."""
    equal = []
    for prompt in prompts():
        expected = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
        got = model.generate(prompt, max_new_tokens=max_new_tokens, custom_generate=str(folder),
                             trust_remote_code=True, **OPTIONS)
        equal.append(torch.equal(got, expected))
    return all(equal), f"{sum(equal)}/{len(equal)} prompts identical"


def check_streamer(model, folder: Path, max_new_tokens: int) -> tuple[bool, str]:
    """``streamer=`` through the folder receives what plain greedy ``generate`` streams."""
    prompt = prompts()[1]
    plain, ours = RecordingStreamer(), RecordingStreamer()
    expected = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, streamer=plain)
    got = model.generate(prompt, max_new_tokens=max_new_tokens, custom_generate=str(folder),
                         trust_remote_code=True, streamer=ours, **OPTIONS)
    first, new, ends, late = ours.summary()
    ok = (first == prompt[0].tolist() and new == got[0, prompt.shape[1]:].tolist() and ends == 1 and not late
          and ours.summary() == plain.summary() and torch.equal(got, expected))
    return ok, f"{len(new)} new tokens in {len(ours.puts) - 1} puts, {ends} end"


def check_options(model, folder: Path, max_new_tokens: int) -> tuple[bool, str]:
    """``draft_stats=`` (one of our keyword arguments) is filled by the engine."""
    from retrieval_draft import DecodeStats

    stats = DecodeStats()
    prompt = prompts()[1]
    got = model.generate(prompt, max_new_tokens=max_new_tokens, custom_generate=str(folder),
                         trust_remote_code=True, draft_stats=stats, **OPTIONS)
    ok = stats.steps > 0 and stats.new_tokens == got.shape[1] - prompt.shape[1]
    return ok, f"draft_stats: {stats.steps} steps, {stats.new_tokens} new tokens"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, default=FOLDER, help="the folder laid out as a Hub repository")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    return parser.parse_args(argv)


def run_check(check, *args) -> tuple[bool, str]:
    """``check(*args)``, or (False, the error's type and first line) when it raises."""
    try:
        return check(*args)
    except Exception as error:  # a report tool: every failure becomes one FAILED line
        return False, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def main(argv: list[str] | None = None) -> int:
    """Run every check, print one line each; 0 when all pass, else 1."""
    import transformers

    args = parse_args(argv)
    model = tiny_llama()
    print(f"transformers {transformers.__version__}, retrieval-draft {installed('retrieval-draft')}, "
          f"folder {args.folder}")
    results = {
        "requirements": run_check(check_requirements, args.folder),
        "load": run_check(check_load, model, args.folder),
        "greedy": run_check(check_greedy, model, args.folder, args.max_new_tokens),
        "streamer": run_check(check_streamer, model, args.folder, args.max_new_tokens),
        "options": run_check(check_options, model, args.folder, args.max_new_tokens),
    }
    for name, (ok, detail) in results.items():
        print(f"{name:12s} {'ok' if ok else 'FAILED'}  {detail}")
    return 0 if all(ok for ok, _ in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
