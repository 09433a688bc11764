"""One command for a machine with a GPU: is the plugin exact there, and what does a tree forward cost?

    python -m tools.gpu_check [--device cuda] [--out gpu_check_out] [--dtypes float32,bfloat16]
                              [--shapes 1b,8b] [--sizes 1,2,4,...,256] [--model PATH] [--quick]

Writes under ``--out``:

- ``equality.json``: greedy ``generate`` through the plugin against HF's own
  greedy ``generate`` on the same device and dtype, judged by the exactness rule
  (``tools.bench.exactness``: identical in float32; in bfloat16/float16 the
  first difference, if any, at a near-tie of plain's logits), for tiny random models of
  several architectures (built from configs, as the tests build them) and the
  real model when its file is present (SmolLM2-135M by default; skipped with
  the reason when it cannot be loaded, e.g. no ``gguf`` package).
- ``cost.json``: milliseconds of one tree forward over k = 1..256 new tokens
  after a 256-token cache (``planning.cost_probe.time_chain``: CUDA-event timed on
  a GPU), for the real model and for randomly initialised models with the
  shapes of Llama 3.2 1B and Llama 3.1 8B in bfloat16 (cost does not depend
  on trained weights).

- ``static.json`` (``--static-archs``, default llama and the real model): the plugin with
  ``cache_implementation="static"`` (fixed tree widths; compiled with HF's defaults on CUDA, CUDA
  graphs included) against HF's own greedy ``generate`` at each of ``--batches`` (left-padded
  batches of random prompts), twice per batch size: the first call's seconds hold the compile
  and capture, the second's replay them; and HF's own static cache on the same prompts, twice.

Each ``equality.json`` run also lists ``sync_sites`` on CUDA: the lines where
the plugin's call made the stream synchronise (``torch.cuda.set_sync_debug_mode``),
with counts; the decode loop itself should add one per step (``transfer.to_host``).

Nothing here needs datrie or gguf at import time (the GPU machines have
neither); ``--device cpu --quick`` runs in seconds on tiny models.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LLAMA_SHAPES = {  # SmolLM2-135M, Llama 3.2 1B and Llama 3.1 8B
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
}


def tiny_configs() -> dict:
    """Architecture name -> a config of a 2-layer random model (Mistral: all layers slide; Gemma 3: some do)."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

    return {
        "llama": LlamaConfig(**TINY),
        "qwen2": Qwen2Config(**TINY),
        "mistral": MistralConfig(**TINY, sliding_window=8),  # every layer slides
        "gemma3": Gemma3TextConfig(**{**TINY, "num_hidden_layers": 4}, head_dim=16, sliding_window=8,
                                   layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    }


def build(config, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A randomly initialised causal LM of ``config`` on ``device`` in ``dtype``, eval mode, SDPA."""
    from transformers import AutoModelForCausalLM

    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = 0
    return model.eval()


def compare(model, prompt: torch.Tensor, max_new_tokens: int, fixed_tree: int = 0) -> dict:
    """Plugin greedy vs HF greedy on ``prompt`` (shape (1, L), on the model's device); with
    ``fixed_tree`` > 0 trees of that many nodes, else the cost-aware planner (its first call per
    model measures the cost curve). ``exact`` holds the exactness rule (``tools.bench.exactness``):
    identical, or in reduced precision parted first at a near-tie of plain's own logits."""
    tree = {"adaptive_tree": False, "tree_budget": fixed_tree} if fixed_tree > 0 else {}
    import retrieval_draft
    from tools.bench.exactness import first_divergence

    plain = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[],
                           output_logits=True, return_dict_in_generate=True)
    expected = plain.sequences
    stats = retrieval_draft.DecodeStats()
    started = time.perf_counter()
    with sync_sites(prompt.device) as sites:
        got = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[],
                             custom_generate=retrieval_draft.generate, draft_stats=stats, **tree)
    seconds = time.perf_counter() - started
    start = prompt.shape[1]
    split = first_divergence(expected[0, start:], got[0, start:], torch.stack(plain.logits)[:, 0], model.dtype)
    identical = bool(got.shape == expected.shape and torch.equal(got, expected))
    return {"identical": identical, "exact": identical or (split is not None and split.near_tie),
            "first_difference": None if split is None else split.position,
            "gap_at_difference": None if split is None else split.gap,
            "near_tie_tolerance": None if split is None else split.tolerance,
            "device": str(got.device), "steps": stats.steps, "mean_accepted": round(stats.mean_accepted, 3),
            "plugin_s": round(seconds, 3), "sync_sites": sites}


@contextmanager
def sync_sites(device: torch.device):
    """On CUDA, the Python lines that made the stream synchronise inside the block, with counts
    (``torch.cuda.set_sync_debug_mode``): the step loop should show one read per step (the
    verdict, ``transfer.to_host``) plus whatever HF's forward does. Empty elsewhere."""
    sites: dict[str, int] = {}
    if device.type != "cuda":
        yield sites
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for warning in caught:
        where = f"{Path(warning.filename).name}:{warning.lineno}"
        sites[where] = sites.get(where, 0) + 1


def static_check(model, prompts: list[torch.Tensor], tokens: int, batch: int) -> dict:
    """Plugin greedy with ``cache_implementation="static"`` against HF greedy on a left-padded batch
    of ``batch`` of ``prompts`` (each (1, L_i)), two calls each (the first compiles and captures):
    per call its seconds and whether every row was exact (``compare``'s rule); HF's static cache's
    two calls timed alike."""
    import retrieval_draft
    from tools.bench.exactness import first_divergence

    chosen = [prompts[i % len(prompts)][0, : prompts[i % len(prompts)].shape[1] - (i % 3)] for i in range(batch)]
    width = max(p.shape[0] for p in chosen)
    ids = torch.zeros((batch, width), dtype=torch.long, device=chosen[0].device)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(chosen):
        ids[row, width - prompt.shape[0]:], mask[row, width - prompt.shape[0]:] = prompt, 1
    common = dict(attention_mask=mask, max_new_tokens=tokens, do_sample=False, eos_token_id=[])
    plain = model.generate(ids, output_logits=True, return_dict_in_generate=True, **common)
    logits = torch.stack(plain.logits)  # (m, B, V)
    out: dict = {"batch": batch, "ours": [], "hf_static_s": []}
    for _ in range(2):
        started = time.perf_counter()
        got = model.generate(ids, custom_generate=retrieval_draft.generate, cache_implementation="static", **common)
        seconds = time.perf_counter() - started
        exact = []
        for row in range(batch):
            split = first_divergence(plain.sequences[row, width:], got[row, width:], logits[:, row], model.dtype)
            exact.append(split is None or split.near_tie)
        out["ours"].append({"s": round(seconds, 3), "identical": bool(torch.equal(got, plain.sequences)),
                            "exact": all(exact)})
    for _ in range(2):
        started = time.perf_counter()
        model.generate(ids, cache_implementation="static", **common)
        out["hf_static_s"].append(round(time.perf_counter() - started, 3))
    return out


def random_prompts(vocab: int, count: int, device: torch.device) -> list[torch.Tensor]:
    """Repetitive random prompts (a block repeated 3 times): retrieval finds drafts in them."""
    rng = np.random.default_rng(0)
    return [torch.from_numpy(np.tile(rng.integers(3, vocab, size=12), 3))[None].to(device) for _ in range(count)]


REAL_TEXTS = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
              "Repeat this line exactly: the quick brown fox jumps over the lazy dog. the quick brown")


def by_model(device: torch.device, archs: list[str], dtypes: list[str], real, prompts: int, check) -> dict:
    """{model: {dtype: check(model, prompts)}} for the tiny architectures in ``archs`` (random
    repetitive prompts) and, where ``archs`` holds "real", the real model (``REAL_TEXTS``), or why it was
    skipped. ``check(model, prompts)``: prompts are (1, L) ids on ``device``."""
    result: dict = {}
    for name, config in tiny_configs().items():
        if name in archs:
            for dtype in dtypes:
                model = build(config, device, DTYPES[dtype])
                result.setdefault(name, {})[dtype] = check(model, random_prompts(config.vocab_size, prompts, device))
    if "real" not in archs:
        return result
    if isinstance(real, str):
        result["real_model"] = {"skipped": real}
        return result
    master, tokenizer = real
    for dtype in dtypes:
        model = copy.deepcopy(master).to(device=device, dtype=DTYPES[dtype])
        ids = [tokenizer(text, return_tensors="pt").input_ids.to(device) for text in REAL_TEXTS]
        result.setdefault("real_model", {})[dtype] = check(model, ids)
    return result


def equality(device: torch.device, archs: list[str], dtypes: list[str], real, prompts: int,
             tokens: int, fixed_tree: int = 0) -> dict:
    """{model: {dtype: [per-prompt ``compare`` results]}} plus the real model's, or why it was skipped."""
    return by_model(device, [*archs, "real"], dtypes, real, prompts,
                    lambda model, ids: [compare(model, p, tokens, fixed_tree) for p in ids])


def statics(device: torch.device, archs: list[str], dtypes: list[str], real, prompts: int, tokens: int,
            batches: list[int]) -> dict:
    """{model: {dtype: [``static_check`` per batch size]}}; "real" in ``archs`` adds the real model."""
    return by_model(device, archs, dtypes, real, max(prompts, 1),
                    lambda model, ids: [static_check(model, ids, tokens, b) for b in batches])


def load_real(path: str | None):
    """(model, tokenizer) of the real model, or a string saying why it is skipped."""
    from retrieval_draft.errors import ModelLoadError
    from retrieval_draft.model.models import load_model_and_tokenizer

    if path == "none":
        return "not asked for (--model none)"
    try:
        return load_model_and_tokenizer(path)
    except (ModelLoadError, ImportError) as error:
        return f"{type(error).__name__}: {error}"


def cost_curve(model, sizes: list[int], cache_len: int, repeats: int, warmups: int) -> dict:
    """{k: median ms of one forward over k new tokens} after a ``cache_len``-token random prompt."""
    from retrieval_draft.planning.cost_probe import time_chain
    from retrieval_draft.model.tree_model import TreeModel

    rng = np.random.default_rng(0)
    tree_model = TreeModel(model, skinny_sizes=frozenset())
    prompt = torch.from_numpy(rng.integers(0, model.config.vocab_size, size=(1, cache_len)))
    tree_model.prefill(prompt)
    return {k: round(time_chain(tree_model, k, rng, repeats, warmups) * 1000, 3) for k in sizes}


def costs(device, shapes: list[str], real, sizes, cache_len: int, repeats: int) -> dict:
    """Cost curves: the tiny Llama (float32), the real model (float32 and bfloat16 on a GPU), the named shapes (bf16)."""
    from transformers import LlamaConfig

    warmups = 3 if device.type != "cpu" else 1
    out = {"tiny_llama/float32": cost_curve(build(LlamaConfig(**TINY), device, torch.float32), sizes, cache_len, repeats, warmups)}
    if isinstance(real, str):
        out["real_model"] = {"skipped": real}
    else:
        for dtype in ("float32", "bfloat16") if device.type != "cpu" else ("float32",):
            model = copy.deepcopy(real[0]).to(device=device, dtype=DTYPES[dtype])
            out[f"real_model/{dtype}"] = cost_curve(model, sizes, cache_len, repeats, warmups)
    for shape in shapes:
        model = build(LlamaConfig(**LLAMA_SHAPES[shape], max_position_embeddings=8192), device, torch.bfloat16)
        out[f"llama_{shape}/bfloat16"] = cost_curve(model, sizes, cache_len, repeats, warmups)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def environment(device: torch.device) -> dict:
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {"device": f"{device.type}:{name}", "torch": torch.__version__, "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="gpu_check_out", help="folder for equality.json and cost.json")
    p.add_argument("--dtypes", type=_csv, default=["float32", "bfloat16"])
    p.add_argument("--archs", type=_csv, default=["llama", "qwen2", "mistral", "gemma3"], help="tiny architectures")
    p.add_argument("--shapes", type=_csv, default=["1b", "8b"], help="random Llama shapes to time (135m, 1b, 8b)")
    p.add_argument("--sizes", type=lambda t: [int(x) for x in _csv(t)], default=list(SIZES))
    p.add_argument("--model", default=None, help="real model (.gguf or folder; default SmolLM2-135M; 'none' skips)")
    p.add_argument("--prompts", type=int, default=4, help="random prompts per tiny model and dtype")
    p.add_argument("--tokens", type=int, default=48, help="new tokens per prompt")
    p.add_argument("--cache-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=10, help="timed forwards per median")
    p.add_argument("--fixed-tree", type=int, default=0, help="tree nodes per step (default 0: the cost-aware planner)")
    p.add_argument("--static-archs", type=_csv, default=["llama", "real"],
                   help="models checked with cache_implementation='static' (tiny architectures, 'real')")
    p.add_argument("--batches", type=lambda t: [int(x) for x in _csv(t)], default=[1, 4, 8],
                   help="batch sizes of the static check")
    p.add_argument("--quick", action="store_true", help="tiny models only, few sizes, fixed trees: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.sizes, args.model, args.prompts, args.tokens = [], [1, 2, 4, 8], "none", 1, 12
        args.cache_len, args.repeats, args.fixed_tree = 32, 2, args.fixed_tree or 16
        args.batches = [1, 2]
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(device)
    real = load_real(args.model)  # (model on CPU, tokenizer), or why not
    checked = equality(device, args.archs, args.dtypes, real, args.prompts, args.tokens, args.fixed_tree)
    _write(out / "equality.json", {**env, "results": checked})
    static = statics(device, args.static_archs, args.dtypes, real, args.prompts, args.tokens, args.batches)
    _write(out / "static.json", {**env, "results": static})
    curves = costs(device, args.shapes, real, args.sizes, args.cache_len, args.repeats)
    _write(out / "cost.json", {**env, "cache_len": args.cache_len, "ms_by_new_tokens": curves})
    failed = [f"{m}/{d}" for m, by in checked.items() for d, runs in by.items()
              if isinstance(runs, list) and not all(r["exact"] for r in runs)]
    failed += [f"static {m}/{d}" for m, by in static.items() for d, runs in by.items()
               if isinstance(runs, list) and not all(call["exact"] for r in runs for call in r["ours"])]
    print(json.dumps({"out": str(out), "not_exact": failed, "curves": list(curves)}, indent=1))
    return 1 if failed else 0


def _write(path: Path, payload: dict) -> None:
    from retrieval_draft.atomic import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(payload, indent=1) + "\n").encode())


if __name__ == "__main__":
    raise SystemExit(main())
