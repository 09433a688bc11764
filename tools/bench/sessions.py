"""Session benchmark: an editor and a chat client's requests, one after another, as they send them.

    python -m tools.bench.sessions [--workloads editor,chat,editor_window] [--systems hf,defaults,no_reuse]
                                   [--model NAME] [--threads N] [--rounds N] [--out PREFIX]
    python -m tools.bench.sessions --report RESULT.json   # re-render a saved run

Workloads: ``tools.bench.session_workloads`` (an editor typing a file with 48-token completions at
docstring ends and one early import edit; a four-turn chat resending its history, 96 tokens a turn;
the editor again through a client that sends only the last 1,536 tokens). Systems, each called as a
user calls it, in one process:

- ``hf``: plain greedy ``model.generate(ids, attention_mask=..., max_new_tokens=N, do_sample=False)``;
- ``defaults``: the README line, ``model.generate(..., custom_generate=retrieval_draft.generate)``
  (prefix reuse on by default);
- ``no_reuse``: the same with ``prefix_cache_bytes=0``.

Every system gets a ``streamer`` (``draft_streamer=`` for ours) that notes when the first new token
arrives, and ours a ``draft_stats=``. Each of our systems calls its own model handle per workload
(``copy.copy``: shared weights, its own plugin memory), so its cache holds only its own session.
Requests run in order; at each request every system runs once, the order rotated per request.
A chat client builds each turn from its own earlier replies. ``--rounds N`` runs every session N
times, each round on fresh handles (empty prefix caches; the cost curve and learned rates that the
first round's calls kept in the cache directory are read back), and the summary takes each
request's fastest round per system: on a machine shared with other jobs a single round measures
their load as much as ours. Per request: wall seconds, time to
first token, new tokens, whether the output equals plain ``generate``'s (and whether the prompts
were equal), reused and prefilled prompt tokens and the bytes the model's prefix cache holds.
Writes PREFIX.json and PREFIX.md (and, while it runs, the runs so far to PREFIX.partial.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import retrieval_draft
from retrieval_draft.atomic import atomic_write_bytes
from tools.bench.report import load_average, machine_info, write_results
from tools.bench.session_workloads import (
    CHAT_NEW_TOKENS, CHAT_TURNS, EDITOR_NEW_TOKENS, EDITOR_SOURCE, EDIT, WINDOW_TOKENS, chat_ids, editor_requests,
    windowed,
)

SYSTEMS = {
    "hf": "plain greedy generate",
    "defaults": "ours, the README call (prefix reuse on)",
    "no_reuse": "ours, prefix_cache_bytes=0",
}
WORKLOADS = ("editor", "chat", "editor_window")
DEFAULT_OUT = "bench/results/sessions"


class FirstToken:
    """An HF streamer that notes when the first new token arrives (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.puts = 0
        self.first_s: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first_s = time.perf_counter() - self.started

    def end(self) -> None:
        pass


@dataclass(frozen=True)
class Call:
    """One timed request of one system: new ids (m,), wall and first-token seconds, our stats or None."""

    new_ids: torch.Tensor
    wall_s: float
    first_s: float | None
    stats: retrieval_draft.DecodeStats | None


def call(system: str, model, ids: list[int], max_new_tokens: int) -> Call:
    """``system``'s ``generate`` call on prompt ``ids`` (wall time of the call alone)."""
    prompt = torch.tensor([ids], dtype=torch.long)
    kwargs = {"attention_mask": torch.ones_like(prompt), "max_new_tokens": max_new_tokens}
    streamer, stats = FirstToken(), None
    if system == "hf":
        kwargs.update(do_sample=False, streamer=streamer)
    else:
        stats = retrieval_draft.DecodeStats()
        kwargs.update(custom_generate=retrieval_draft.generate, draft_streamer=streamer, draft_stats=stats)
        if system == "no_reuse":
            kwargs["prefix_cache_bytes"] = 0
    streamer.started = started = time.perf_counter()
    out = model.generate(prompt, **kwargs)
    wall = time.perf_counter() - started
    return Call(out[0, prompt.shape[1]:].clone(), wall, streamer.first_s, stats)


def run_session(workload: str, requests, systems: list[str], models: dict, tokenizer, max_new_tokens: int,
                log=None) -> list[dict]:
    """Every request of one session for every system, in order; one record per (request, system).

    ``requests``: the editor's ``EditorRequest``s, or for ``chat`` the user turns (strings);
    ``models``: system -> the model object it calls."""
    histories = {name: [] for name in systems}
    records = []
    for index, request in enumerate(requests):
        order = systems[index % len(systems):] + systems[: index % len(systems)]
        calls, prompts = {}, {}
        for name in order:
            if workload == "chat":
                prompts[name] = chat_ids(tokenizer, histories[name], request)
            else:
                prompts[name] = list(request.ids)
            calls[name] = call(name, models[name], prompts[name], max_new_tokens)
            if workload == "chat":
                reply = tokenizer.decode(calls[name].new_ids, skip_special_tokens=True)
                histories[name] += [("user", request), ("assistant", reply)]
        for name in systems:
            records.append(_record(workload, index, request, name, prompts, calls))
        if log is not None:
            log(f"[sessions] {workload} #{index}: " + ", ".join(f"{n} {calls[n].wall_s:.2f}s" for n in systems))
    return records


def _record(workload: str, index: int, request, name: str, prompts: dict, calls: dict) -> dict:
    """One (request, system) record; ``identical`` compares with plain ``generate``'s output."""
    got, stats = calls[name], calls[name].stats
    record = {
        "workload": workload, "request": index,
        "request_id": getattr(request, "request_id", f"turn {index + 1}"),
        "edited": getattr(request, "edited", False), "system": name, "prompt_tokens": len(prompts[name]),
        "wall_s": round(got.wall_s, 4), "first_token_s": None if got.first_s is None else round(got.first_s, 4),
        "new_tokens": int(got.new_ids.shape[0]), "load_1m": (load_average() or [None])[0],
    }
    if "hf" in calls:
        record["same_prompt_as_hf"] = prompts[name] == prompts["hf"]
        record["identical"] = bool(torch.equal(got.new_ids, calls["hf"].new_ids))
    if stats is not None:
        record.update(reused_tokens=stats.reused_tokens, prefilled_tokens=stats.prefilled_tokens,
                      prefix_cache_bytes=stats.prefix_cache_bytes, reuse_note=stats.reuse_note,
                      prefill_s=round(stats.prefill_s, 4), mean_accepted=round(stats.mean_accepted, 3))
    return record


def fastest(records: list[dict]) -> list[dict]:
    """Per (workload, request, system) the record of its fastest round."""
    best: dict[tuple, dict] = {}
    for r in records:
        key = (r["workload"], r["request"], r["system"])
        if key not in best or r["wall_s"] < best[key]["wall_s"]:
            best[key] = r
    return list(best.values())


def summarize(records: list[dict], systems: list[str]) -> dict:
    """Per workload and system, the speed-ups over ``hf`` (and over ``no_reuse``). Side by side (the
    headline): each request's ratio within a round, the median over rounds; their median and
    range over requests; the session's (total walls of a round, the median over rounds); the
    median first-token ratio. ``fastest_*``: the same from each request's fastest round per system."""
    out = {}
    for workload in dict.fromkeys(r["workload"] for r in records):
        rows = [r for r in records if r["workload"] == workload]
        each = {(r.get("round", 0), r["request"], r["system"]): r for r in rows}
        best = {(r["request"], r["system"]): r for r in fastest(rows)}
        rounds, requests = sorted({k[0] for k in each}), sorted({r["request"] for r in rows})
        out[workload] = {}
        for name in systems:
            entry = {}
            for base in ("hf", "no_reuse"):
                if base != name and base in systems:
                    entry[f"over_{base}"] = _speedups(each, best, rounds, requests, base, name)
            entry["identical"] = sum(1 for r in rows if r["system"] == name and r.get("identical"))
            entry["runs"] = sum(1 for r in rows if r["system"] == name)
            out[workload][name] = entry
    return out


def _speedups(each: dict, best: dict, rounds: list[int], requests: list[int], base: str, name: str) -> dict:
    """``base``'s wall over ``name``'s (see ``summarize``); ``each``: (round, request, system) -> record,
    ``best``: (request, system) -> its fastest round's record."""
    def wall(key):
        return each[key]["wall_s"]

    side = [statistics.median(wall((k, i, base)) / wall((k, i, name)) for k in rounds) for i in requests]
    first = [statistics.median(each[k, i, base]["first_token_s"] / each[k, i, name]["first_token_s"] for k in rounds)
             for i in requests if all(each[k, i, base]["first_token_s"] and each[k, i, name]["first_token_s"]
                                      for k in rounds)]
    session = statistics.median(sum(wall((k, i, base)) for i in requests) / sum(wall((k, i, name)) for i in requests)
                                for k in rounds)
    quickest = [best[i, base]["wall_s"] / best[i, name]["wall_s"] for i in requests]
    return {
        "per_request": [round(x, 3) for x in side], "median": round(statistics.median(side), 3),
        "min": round(min(side), 3), "max": round(max(side), 3), "session": round(session, 3),
        "first_token_median": round(statistics.median(first), 3) if first else None,
        "fastest_per_request": [round(x, 3) for x in quickest], "fastest_median": round(statistics.median(quickest), 3),
        "fastest_min": round(min(quickest), 3),
    }


def markdown(result: dict) -> str:
    """The report: a summary per workload and system, then every request."""
    machine = result["machine"]
    lines = [
        f"# Sessions: an editor and a chat client, request by request ({machine.get('cpu')}, "
        f"{result['threads']} threads)", "",
        f"Model: {result['model']}; command: `{result['command']}`; load average (1/5/15 min) before and after: "
        f"{result['load_average_before_after']}; cache: {result['cache_state']}.", "",
        "Speed-ups side by side: each request's ratio within a round, the median over rounds (fastest "
        "round per system in brackets).", "",
        "| workload | system | median per request vs plain | range | session vs plain | median vs reuse off | "
        "median first token vs plain | identical runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for workload, systems in result["summary"].items():
        for name, entry in systems.items():
            if name == "hf":
                continue
            hf, off = entry.get("over_hf", {}), entry.get("over_no_reuse", {})
            lines.append(
                f"| {workload} | {name} | {hf.get('median', 'n/a')}x ({hf.get('fastest_median', 'n/a')}x) | "
                f"{hf.get('min', 'n/a')}-{hf.get('max', 'n/a')}x | "
                f"{hf.get('session', 'n/a')}x | {str(off['median']) + 'x' if off else ''} | "
                f"{hf.get('first_token_median', 'n/a')}x | {entry['identical']}/{entry['runs']} |")
    lines += ["", "Each request's fastest round per system, and its speed-up over plain side by side:", "",
              "| workload | request | prompt tokens | system | wall s | first token s | vs plain | reused / prefilled | "
              "cache MiB | identical |", "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in sorted(fastest(result["runs"]), key=lambda r: (r["workload"], r["request"])):
        reuse = f"{r['reused_tokens']} / {r['prefilled_tokens']}" if "reused_tokens" in r else ""
        held = f"{r['prefix_cache_bytes'] / 2**20:.1f}" if "prefix_cache_bytes" in r else ""
        side = result["summary"][r["workload"]][r["system"]].get("over_hf", {}).get("per_request")
        ratio = f"{side[r['request']]:.2f}x" if side else ""
        lines.append(f"| {r['workload']} | {r['request_id']}{' (edited)' if r['edited'] else ''} | {r['prompt_tokens']} | "
                     f"{r['system']} | {r['wall_s']:.2f} | {r['first_token_s'] or 0:.2f} | {ratio} | {reuse} | {held} | "
                     f"{r.get('identical', '')} |")
    check = result.get("prefill_check")
    if check:
        own, ours = check["model_forward"], check["our_prefill"]
        lines += ["", f"Cold prefill of the longest editor prompt ({check['prompt_tokens']} tokens), fastest of "
                  f"{len(own['wall_s'])} interleaved rounds: the model's own forward {own['min_wall_s']} s wall / "
                  f"{own['min_cpu_s']} s CPU, ours {ours['min_wall_s']} s / {ours['min_cpu_s']} s."]
    return "\n".join(lines) + "\n"


def prefill_check(model, ids: list[int], rounds: int = 3) -> dict:
    """Our cold prefill (``TreeModel.prefill``: our cache, no reuse) against the model's own forward
    over the same prompt, interleaved ``rounds`` times: the fastest wall and process CPU seconds of each."""
    from retrieval_draft.model.tree_model import TreeModel

    prompt = torch.tensor([ids], dtype=torch.long)

    def own():
        with torch.no_grad():
            model(prompt, logits_to_keep=1)

    timings = {"model_forward": [], "our_prefill": []}
    for _ in range(rounds):
        for name, run in (("model_forward", own), ("our_prefill", lambda: TreeModel(model).prefill(prompt))):
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            timings[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    out = {name: {"min_wall_s": round(min(w for w, _ in v), 3), "min_cpu_s": round(min(c for _, c in v), 3),
                  "wall_s": [round(w, 3) for w, _ in v]} for name, v in timings.items()}
    out["prompt_tokens"] = len(ids)
    return out


def build_requests(workload: str, tokenizer) -> tuple[list, int]:
    """(the workload's requests, new tokens per request)."""
    if workload == "chat":
        return list(CHAT_TURNS), CHAT_NEW_TOKENS
    requests = editor_requests(tokenizer)
    return (windowed(requests, WINDOW_TOKENS) if workload == "editor_window" else requests), EDITOR_NEW_TOKENS


def main(argv: list[str] | None = None) -> dict:
    import os

    from retrieval_draft.cache_dir import CACHE_ENV
    from retrieval_draft.sessions.session import load_session
    from tools.bench.run import code_version

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="editor,chat")
    p.add_argument("--systems", default="hf,defaults,no_reuse")
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--rounds", type=int, default=2, help="times each session runs, each on fresh handles")
    p.add_argument("--report", default=None, help="re-render a saved RESULT.json (summary and markdown) and stop")
    p.add_argument("--prefill-rounds", type=int, default=3,
                   help="rounds of our cold prefill against the model's forward on the longest editor prompt (0: skip)")
    args = p.parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text(encoding="utf-8"))
        saved["summary"] = summarize(saved["runs"], list(saved["systems"]))
        write_results(Path(args.report).with_suffix(""), saved, markdown(saved))
        return saved
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if any(w not in WORKLOADS for w in workloads) or any(s not in SYSTEMS for s in systems):
        p.error(f"--workloads takes {', '.join(WORKLOADS)}; --systems takes {', '.join(SYSTEMS)}")
    torch.set_num_threads(args.threads)
    session = load_session(args.model)
    model, tokenizer = session.model, session.tokenizer
    if "chat" in workloads and not getattr(tokenizer, "chat_template", None):
        p.error(f"the chat workload needs a model with a chat template; {args.model or 'the default model'} has none")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    model.generate(torch.tensor([tokenizer.encode("def f():")]), max_new_tokens=8, do_sample=False)  # torch's set-up
    load_before, runs = load_average(), []
    partial = Path(args.out).with_suffix(".partial.json")
    for round_ in range(args.rounds):
        for workload in workloads:
            requests, new_tokens = build_requests(workload, tokenizer)
            models = {name: model if name == "hf" else copy.copy(model) for name in systems}
            runs += [{**r, "round": round_} for r in run_session(workload, requests, systems, models, tokenizer,
                                                                   new_tokens, log)]
            atomic_write_bytes(partial, (json.dumps({"systems": systems, "runs": runs}) + "\n").encode())
    longest = max(editor_requests(tokenizer), key=lambda r: len(r.ids)).ids
    check = prefill_check(model, list(longest), args.prefill_rounds) if args.prefill_rounds else None
    result = {
        "command": " ".join(["python -m tools.bench.sessions", *(sys.argv[1:] if argv is None else argv)]),
        "model": args.model or "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to fp32)",
        "threads": args.threads, "rounds": args.rounds, "machine": machine_info(), "code": code_version(),
        "cache_state": f"{CACHE_ENV}={os.environ.get(CACHE_ENV, '(unset: the user cache)')}",
        "editor_source": "/".join(EDITOR_SOURCE), "edit": list(EDIT), "window_tokens": WINDOW_TOKENS,
        "warm_up": "one plain greedy generate of 8 tokens (untimed)",
        "load_average_before_after": [load_before, load_average()], "systems": {s: SYSTEMS[s] for s in systems},
        "runs": runs, "summary": summarize(runs, systems), "prefill_check": check,
    }
    write_results(args.out, result, markdown(result))
    partial.unlink(missing_ok=True)
    return result


if __name__ == "__main__":
    main()
