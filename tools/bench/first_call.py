"""One ``model.generate`` call in a fresh process: what a script that generates once pays.

    python -m tools.bench.first_call --system ours|hf [--datastore DIR]... [--model PATH]
                               [--max-new-tokens N] [--threads N] [--temperature T --seed S]
                               [--prompt TEXT [--chat]]        (else JSON {"input_ids": [...]} on stdin)

Imports torch, transformers and retrieval_draft, loads the model and tokenizer
(``retrieval_draft.model.models.load_model_and_tokenizer``, default SmolLM2-135M),
then times the process's first ``generate`` call, to the last token:

- ``ours``: ``model.generate(**inputs, max_new_tokens=N, custom_generate=retrieval_draft.generate)``,
  plus ``datastore=DIR, draft_tokenizer=tokenizer`` when ``--datastore`` is given (given more
  than once: ``datastore=[DIR1, DIR2, ...]``)
  (the README's lines, default options; ``draft_stats=`` only reads statistics);
- ``hf``: ``model.generate(**inputs, max_new_tokens=N, do_sample=False)``.

Nothing is warmed up: the call includes every one-off cost (torch's first
forward, the plugin's cost curve unless it finds one on disk, opening the
store). Prints one JSON line on stdout: ``import_s``, ``load_s`` and
``generate_s`` (wall seconds), ``prompt_tokens``, ``new_tokens``,
``output_ids`` (the new token ids) and, for ours, ``stats``.
``python -m tools.bench --fresh-process`` runs it twice per workload.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--system", choices=("ours", "hf"), required=True)
    p.add_argument("--model", default=None, help="local model directory or .gguf (default SmolLM2-135M)")
    p.add_argument("--datastore", action="append", default=None,
                   help="datastore directory (ours only): datastore=DIR; repeat for datastore=[DIR1, DIR2]")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default greedy)")
    p.add_argument("--seed", type=int, default=0, help="torch seed set before the call (sampling)")
    p.add_argument("--prompt", default=None, help="prompt text (default: read token ids from stdin)")
    p.add_argument("--chat", action="store_true", help="wrap --prompt in the model's chat template")
    return p.parse_args(argv)


def prompt_ids(args: argparse.Namespace, tokenizer) -> list[int]:
    """The prompt's token ids: ``--prompt`` encoded (chat template with ``--chat``), else stdin JSON."""
    if args.prompt is None:
        return [int(i) for i in json.loads(sys.stdin.read())["input_ids"]]
    if args.chat:
        messages = [{"role": "user", "content": args.prompt}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
    return list(tokenizer(args.prompt)["input_ids"])


def call_kwargs(args: argparse.Namespace, tokenizer) -> dict:
    """The generate keyword arguments beside ``**inputs`` (the README's lines)."""
    import retrieval_draft

    kwargs: dict = {"max_new_tokens": args.max_new_tokens}
    if args.temperature is not None:
        kwargs.update(do_sample=True, temperature=args.temperature)
    if args.system == "hf":
        kwargs.setdefault("do_sample", False)
        return kwargs
    kwargs["custom_generate"] = retrieval_draft.generate
    if args.datastore is not None:
        datastore = args.datastore[0] if len(args.datastore) == 1 else args.datastore
        kwargs.update(datastore=datastore, draft_tokenizer=tokenizer)
    return kwargs


def main(argv: list[str] | None = None) -> int:
    """Import, load, time one generate call; print the JSON line."""
    args = parse_args(argv)
    if args.system == "hf" and args.datastore is not None:
        raise SystemExit("--datastore is for --system ours")
    started = time.perf_counter()
    import torch
    import transformers

    import retrieval_draft
    from retrieval_draft.model.models import load_model_and_tokenizer

    import_s = time.perf_counter() - started
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(args.model)
    load_s = time.perf_counter() - started
    ids = torch.tensor([prompt_ids(args, tokenizer)], dtype=torch.long)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    kwargs = call_kwargs(args, tokenizer)
    stats = retrieval_draft.DecodeStats() if args.system == "ours" else None
    if stats is not None:
        kwargs["draft_stats"] = stats
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    out = model.generate(**inputs, **kwargs)
    generate_s = time.perf_counter() - started
    new = out[0, ids.shape[1]:].tolist()
    record = {
        "system": args.system,
        "datastore": args.datastore,
        "import_s": round(import_s, 4),
        "load_s": round(load_s, 4),
        "generate_s": round(generate_s, 4),
        "prompt_tokens": int(ids.shape[1]),
        "new_tokens": len(new),
        "output_ids": new,
        "threads": torch.get_num_threads(),
        "pid": os.getpid(),
        "stats": None if stats is None else {"steps": stats.steps, "mean_accepted": round(stats.mean_accepted, 4)},
    }
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
