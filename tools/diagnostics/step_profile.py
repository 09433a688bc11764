"""Host time per decoding step, split by phase, through the README's ``generate`` call.

    python -m tools.diagnostics.step_profile [--models tiny,smollm2,llama-1b] [--batches 1,8]
        [--max-new-tokens 128] [--datastore DIR] [--device cuda] [--static] [--tiny-vocab N] [--cache user|fresh] [--json PATH]

Every configuration calls ``model.generate(..., custom_generate=retrieval_draft.generate,
draft_stats=stats)`` with the defaults (a fresh ``PluginMemory`` each, warmed by two untimed
calls: kernel compilation, the cost curve and its one re-measurement; ``probe forwards`` counts
timed forwards that still served the curve's measurement) and reads the phases ``DecodeStats`` times
(``draft``, ``plan``, ``pack``, ``forward``, ``readout``, ``accept``), in ms per step (per
forward: B rows verified together take one step), on the host's clock; ``device forward`` is
the forward as the device timed it (CUDA events on a GPU) and ``host`` the step outside it
(on a GPU the model call only launches the forward and ``readout`` waits for it). Beside it,
plain HF greedy ``generate`` on the same prompts: its host ms per token, the call's wall
time minus the time inside the model's forward (forward hooks, synchronised on a GPU), and
the wall-time ratio of the two (``speed-up``, HF's wall over ours).

``beyond plain`` is the held-out definition of our host time: the step's wall time minus ONE plain
causal forward over as many new tokens as the step verified (its nodes per step, interpolated between
whole counts) on a cache of the run's mean length (a ``DynamicCache``, the model's own causal mask,
no tree mask, positions or pool: what a forward costs anyone). It holds everything a step does that
a plain forward does not, the tree forward's own extras included, which ``host`` (the step less our
own forward) does not see. ``kept @T`` projects the share of the accepted tokens a GPU keeps when a
forward costs T ms: (T + HF host per token) / (T + beyond plain). ``--static`` adds each
configuration with ``cache_implementation="static"`` (fixed widths over a preallocated cache).

Models: ``tiny`` is a 2-layer Llama of width 64 with SmolLM2's 49,152-token vocabulary and
random weights, so the forward is nearly free and host work shows; its prompts are random
ids, ``fresh`` (each prompt once) and ``replayed`` (each prompt a second time: the output
history drafts the whole answer, many tokens per step, so per-token work shows). ``smollm2``
runs the benchmark's code_raw and chat prompts; ``llama-1b`` is a randomly initialised model
of Llama 3.2 1B's shape in bfloat16 (for a GPU: a forward of realistic cost) with the tiny
model's prompts. ``--tiny-vocab N`` gives the tiny model another vocabulary: on a CPU its forward
then streams less (49,152 x 64 output weights and the W x 49,152 logits it writes pass through the
caches every step, and the host work after it starts cold), as a GPU's forward leaves the host's
caches alone. ``--cache fresh`` plans from a cache of the run's own (``tools.bench.cache_state``): the
warm-up measures the cost curve, and with it which sizes take the skinny matmul, on the machine as it
is now, not as an earlier run found it; the JSON says what each model's cache held (``cache``). Diagnostics, not speed claims (those come from ``python -m tools.bench``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from contextlib import contextmanager
from pathlib import Path

import torch

import retrieval_draft
from retrieval_draft.atomic import atomic_write_bytes
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.planning.timing import synchronize
from tools.bench.cache_state import CACHE_MODES, fresh_cache, planning_records

PHASES = ("draft", "plan", "pack", "forward", "readout", "accept")
WARM_UP_RETRIES = 3  # more untimed calls, at most, while the cost curve's measurement is still open
TINY_VOCAB = 49_152  # SmolLM2's


def tiny_model(shape: dict | None = None, device: str = "cpu", dtype=torch.float32):
    """The near-free model: 2 Llama layers of width 64, SmolLM2's vocabulary, random weights
    (``shape``: other Llama config fields, e.g. ``tools.gpu_check.LLAMA_SHAPES['1b']``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    fields = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    fields.update(shape or {})
    config = LlamaConfig(**fields, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


def random_batches(count: int, rows: int, length: int = 64, seed: int = 0, device: str = "cpu",
                   vocab: int = TINY_VOCAB) -> list[torch.Tensor]:
    """``count`` batches of shape (rows, length) of random ids in [3, vocab)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (rows, length), generator=generator).to(device) for _ in range(count)]


def _synchronize(model) -> None:
    synchronize(next(model.parameters()).device)


@contextmanager
def forward_clock(model):
    """Yields a list that collects the seconds spent inside ``model``'s forward calls."""
    spent, started = [], []

    def enter(*_):
        _synchronize(model)
        started.append(time.perf_counter())

    def leave(*_):
        _synchronize(model)
        spent.append(time.perf_counter() - started.pop())

    hooks = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]
    try:
        yield spent
    finally:
        for hook in hooks:
            hook.remove()


def ours(model, batches: list[torch.Tensor], max_new_tokens: int, memory: PluginMemory, **extra) -> dict:
    """The README call on every batch; ms per step by phase, tokens and nodes per step."""
    total, wall = DecodeStats(), 0.0
    for ids in batches:
        stats = DecodeStats()
        _synchronize(model)
        started = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                       custom_generate=retrieval_draft.generate, draft_stats=stats, draft_memory=memory, **extra)
        wall += time.perf_counter() - started
        for name in ("forwards", "probe_forwards", "steps", "step_tokens", "tree_nodes", "new_tokens"):
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        for phase in (*PHASES, "device_forward"):
            setattr(total, f"{phase}_s", getattr(total, f"{phase}_s") + getattr(stats, f"{phase}_s"))
    per_step = lambda seconds: round(1000 * seconds / max(total.forwards, 1), 3)  # noqa: E731
    row = {phase: per_step(getattr(total, f"{phase}_s")) for phase in PHASES}
    row.update(host=per_step(total.host_s), device_forward=per_step(total.device_forward_s), step=per_step(total.decode_s),
               forwards=total.forwards, probe_forwards=total.probe_forwards, wall_s=wall, new_tokens=total.new_tokens,
               tokens_per_step=round(total.step_tokens / max(total.forwards, 1), 2),
               nodes_per_step=round(total.tree_nodes / max(total.forwards, 1), 2))
    return row


def plain_forward_ms(model, cache_len: int, tokens: float, repeats: int = 7) -> float:
    """Median ms of one plain causal forward over ``tokens`` new tokens (interpolated between the
    whole counts around it) after ``cache_len`` cached ones, on a ``DynamicCache`` (one row)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    low, high = max(1, int(tokens)), max(1, int(tokens)) + 1
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, model.config.vocab_size, (1, cache_len), generator=generator).to(device)
    timed = {}
    with torch.no_grad():
        cache = DynamicCache()
        model(prompt, cache=cache, use_cache=True, logits_to_keep=1)
        for count in (low, high):
            new = torch.randint(3, model.config.vocab_size, (1, count), generator=generator).to(device)
            seconds = []
            for _ in range(repeats):
                _synchronize(model)
                started = time.perf_counter()
                model(new, cache=cache, use_cache=True)
                _synchronize(model)
                seconds.append(time.perf_counter() - started)
                cache.crop(-count)  # back to the prompt (crop takes what to remove)
            timed[count] = sorted(seconds)[len(seconds) // 2]
    share = min(max(tokens - low, 0.0), 1.0)
    return 1000 * (timed[low] + share * (timed[high] - timed[low]))


def held_out(row: dict, model, cache_len: int) -> None:
    """Add ``beyond_plain`` (ms: the step less one plain causal forward over its nodes) and the kept
    shares at 8 and 3 ms forwards to ``row`` (see the module docstring)."""
    plain = plain_forward_ms(model, cache_len, max(row["nodes_per_step"], 1.0))
    beyond = max(row["step"] - plain, 0.0)
    row["plain_forward"] = round(plain, 3)
    row["beyond_plain"] = round(beyond, 3)
    for forward_ms in (8.0, 3.0):
        row[f"kept_{forward_ms:g}ms"] = round((forward_ms + row["hf_host_per_token"]) / (forward_ms + beyond), 3)


def plain_host_ms(model, batches: list[torch.Tensor], max_new_tokens: int) -> tuple[float, float]:
    """Plain HF greedy: (wall - time inside the forward) per generated token (per row-token
    step: a batch's B rows advance together), in ms; the calls' wall seconds."""
    wall = tokens = 0.0
    with forward_clock(model) as spent:
        for ids in batches:
            _synchronize(model)
            started = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False)
            _synchronize(model)
            wall += time.perf_counter() - started
            tokens += out.shape[1] - ids.shape[1]
    return round(1000 * (wall - sum(spent)) / max(tokens, 1), 3), wall


def profile(model, label: str, batches: list[torch.Tensor], max_new_tokens: int, replay: bool, **extra) -> dict:
    """One configuration's row: our phases (fresh prompts; with ``replay`` also each prompt again)
    and HF's host ms per token."""
    memory = PluginMemory(persist=False)
    # untimed, on the timed memory: a call as long as a timed one, twice (the second replayed, so
    # drafts are merged, pruned and graded), so every Numba kernel is compiled or loaded (a 16-token
    # warm-up alone left some to compile inside timed steps: 4.7 ms of planning per step on a fresh H100
    # VM) and the one-off costs of a process are paid: the cost curve's measurement, and the one
    # re-measurement a curve gets when decoding's forwards drift from it (``PluginMemory.after_call``;
    # with a 16-token warm-up, 17 of a replayed pass's 33 steps once timed sizes for it). The warm-up's
    # prompt is random, so its history drafts nothing for the timed ones. ``probe_forwards`` counts
    # the timed forwards that still served a measurement.
    ours(model, batches[:1], max_new_tokens, memory, **extra)
    ours(model, batches[:1], max_new_tokens, memory, **extra)
    for _ in range(WARM_UP_RETRIES):  # a re-measurement the warm-up started is finished in the warm-up
        if memory.model(model).probe is None:
            break
        ours(model, batches[:1], max_new_tokens, memory, **extra)
    rows = {f"{label} fresh": ours(model, batches[1:], max_new_tokens, memory, **extra)}
    if replay:
        rows[f"{label} replayed"] = ours(model, batches[1:], max_new_tokens, memory, **extra)
    hf, hf_wall = plain_host_ms(model, batches[1:], max_new_tokens)
    cache_len = batches[1].shape[1] + max_new_tokens // 2  # the mean cache length of a step
    for row in rows.values():
        row["hf_host_per_token"] = hf
        row["speedup"] = round(hf_wall / row.pop("wall_s"), 3)  # same prompts, same new tokens (greedy, identical)
        if batches[1].shape[0] == 1:  # the definition is per row: B = 1 only
            held_out(row, model, cache_len)
    return rows


def markdown(table: dict) -> str:
    """The table: one row per configuration, ms per step."""
    columns = ("host", "device_forward", *PHASES)
    lines = ["| configuration | tokens/step | nodes/step | " + " | ".join(f"{c.replace('_', ' ')} ms" for c in columns)
             + " | HF host ms/token | speed-up | step ms | plain forward ms | beyond plain ms | kept @8 ms | kept @3 ms"
             + " | forwards (probe) |",
             "|---|---:|---:|" + "---:|" * (len(columns) + 8)]
    for label, row in table.items():
        held = " | ".join(f"{row[c]:.2f}" if c in row else "" for c in
                          ("step", "plain_forward", "beyond_plain", "kept_8ms", "kept_3ms"))
        lines.append(f"| {label} | {row['tokens_per_step']} | {row['nodes_per_step']} | "
                     + " | ".join(f"{row[c]:.2f}" for c in columns)
                     + f" | {row['hf_host_per_token']:.2f} | {row['speedup']:.2f}x | {held}"
                     + f" | {row['forwards']} ({row['probe_forwards']}) |")
    return "\n".join(lines)


def smollm2_batches(session, rows: int, count: int) -> list[torch.Tensor]:
    """Benchmark prompts (code_raw, then chat) in batches of ``rows``, left-padded."""
    from tools.bench.workloads import build_workloads

    prompts = [p for group in build_workloads(["code_raw", "chat"], count * rows + rows, seed=0).values() for p in group]
    texts = [session.tokenizer.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False,
                                                   add_generation_prompt=True) if p.chat else p.text for p in prompts]
    batches = []
    for start in range(0, (count + 1) * rows, rows):
        encoded = session.tokenizer(texts[start : start + rows], padding=True, padding_side="left", return_tensors="pt")
        batches.append(encoded["input_ids"])
    return batches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny,smollm2", help="comma list of tiny, smollm2, llama-1b")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the tiny and llama-1b models)")
    p.add_argument("--batches", default="1,8", help="comma list of batch sizes")
    p.add_argument("--prompts", type=int, default=4, help="timed batches per configuration")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--datastore", help="also profile the tiny model with this store (SmolLM2's tokenizer)")
    p.add_argument("--json", help="write the table as JSON here")
    p.add_argument("--static", action="store_true", help="also each configuration with cache_implementation='static'")
    p.add_argument("--cache", choices=CACHE_MODES, default="user",
                   help="plan from the user's cache as it is, or from a fresh one (the warm-up measures the cost curve)")
    p.add_argument("--tiny-vocab", type=int, default=TINY_VOCAB,
                   help="the tiny model's vocabulary (default SmolLM2's; a small one leaves the CPU's caches to the host work)")
    args = p.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or not set(models) <= {"tiny", "smollm2", "llama-1b"}:
        p.error("--models takes a comma list of tiny, smollm2, llama-1b")
    sizes = [int(b) for b in args.batches.split(",")]
    with fresh_cache() if args.cache == "fresh" else contextlib.nullcontext():
        return _run(args, models, sizes)


def _run(args, models: list[str], sizes: list[int]) -> int:
    """``main``'s work, in the cache ``--cache`` chose."""
    torch.set_num_threads(1)  # the tiny model's forward is fastest on one thread
    table: dict = {}
    caches: dict = {}  # what the cache held for each model when its profile began (``planning_records``)
    for name in [m for m in models if m != "smollm2"]:
        vocab = args.tiny_vocab if name == "tiny" else TINY_VOCAB
        if name == "tiny":
            model = tiny_model(shape={"vocab_size": vocab}, device=args.device)
        else:
            from tools.gpu_check import LLAMA_SHAPES

            model = tiny_model(shape=LLAMA_SHAPES["1b"], device=args.device, dtype=torch.bfloat16)
        caches[name] = planning_records(model, args.cache)
        for rows in sizes:
            batches = random_batches(args.prompts + 1, rows, seed=rows, device=args.device, vocab=vocab)
            table.update(profile(model, f"{name} B={rows}", batches, args.max_new_tokens, replay=True))
            if args.static:
                table.update(profile(model, f"{name} B={rows} static", batches, args.max_new_tokens, replay=True,
                                     cache_implementation="static"))
            if args.datastore:
                table.update(profile(model, f"{name} B={rows} datastore", batches, args.max_new_tokens, replay=False,
                                     datastore=args.datastore))
    if "smollm2" in models:
        from retrieval_draft.sessions.session import load_session

        torch.set_num_threads(2)
        session = load_session()
        caches["smollm2"] = planning_records(session.model, args.cache)
        for rows in sizes:
            batches = smollm2_batches(session, rows, args.prompts)
            table.update(profile(session.model, f"smollm2 B={rows}", batches, args.max_new_tokens, replay=False))
            if args.static:
                table.update(profile(session.model, f"smollm2 B={rows} static", batches, args.max_new_tokens,
                                     replay=False, cache_implementation="static"))
    print(markdown(table))
    if args.json:
        device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        payload = {"threads": torch.get_num_threads(), "device": device, "max_new_tokens": args.max_new_tokens,
                   "tiny_vocab": args.tiny_vocab, "cache": caches,
                   "ms_per_step": table}
        atomic_write_bytes(Path(args.json), (json.dumps(payload, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
