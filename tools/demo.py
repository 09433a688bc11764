"""The main job (`make demo`): SmolLM2-135M writes and edits code, side by side with HF greedy.

Builds a datastore from the Python standard library once (cached under the
``--store`` directory), then runs two chat prompts, a code-writing one and a
code-editing one, through plain HF ``generate`` and through retrieval-draft,
and prints both speeds, the speedup and whether the outputs are identical.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import sysconfig
import textwrap
import time

import torch

from retrieval_draft.cli.compare import compare_with_plain
from retrieval_draft.sessions.session import GenerationRequest, load_session

WRITE_PROMPT = (
    "Write a Python function `parse_config(path)` that reads an INI file with configparser and "
    "returns a dict of dicts (section -> option -> value). Handle a missing file by raising "
    "FileNotFoundError with a helpful message. Include a docstring and type hints."
)


def _edit_prompt() -> str:
    """A grounded code prompt: a real standard-library function to annotate."""
    import textwrap as source_module

    code = inspect.getsource(source_module.TextWrapper._split)
    return "Add type hints to this method and return it unchanged otherwise:\n\n```python\n" + code + "```"


def _ensure_datastore(store: str) -> str | None:
    """Build the stdlib datastore into ``store`` unless it is already there."""
    if os.path.exists(os.path.join(store, "manifest.json")):
        return store
    from retrieval_draft_datastore.cli import main as cli_main

    stdlib = sysconfig.get_paths()["stdlib"]
    print(f"building a datastore from {stdlib} (once; cached in {store}) ...", file=sys.stderr)
    started = time.perf_counter()
    code = cli_main(
        ["build", stdlib, "--glob", "*.py", "--exclude", "site-packages", "--exclude", "test", "--out", store]
    )
    if code != 0:
        print("datastore build failed; continuing with prompt lookup only", file=sys.stderr)
        return None
    print(f"built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return store


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default=".cache/stdlib-datastore")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--no-datastore", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    store = None if args.no_datastore else _ensure_datastore(args.store)
    session = load_session(None, store)
    for title, prompt in (("write new code", WRITE_PROMPT), ("edit given code", _edit_prompt())):
        request = GenerationRequest(prompt=prompt, chat=True, max_new_tokens=args.max_new_tokens)
        result = compare_with_plain(session, request)
        print(f"\n=== {title} (SmolLM2-135M-Instruct, {torch.get_num_threads()} threads) ===")
        print(textwrap.indent(result.text.strip(), "    "))
        print()
        print(result.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
