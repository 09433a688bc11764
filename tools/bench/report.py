"""Turning timed runs into numbers: per-prompt medians, per-workload summaries, table, chart.

Definitions (the same for every system):
- decode tokens/s of one run = new tokens / (wall - prefill), with prefill the
  fastest of three separate forward passes over the prompt (one with --quick; the decode time
  floored at a tenth of the wall, against a noisy prefill estimate);
- per prompt: the median of the repeats' tokens/s; speedup = that median
  over HF ``generate``'s median on the same prompt; wall speed-up = HF's median
  wall time over the system's, prefill included (what a long prompt's user waits);
- per workload: mean tokens/s over prompts, geometric mean of the speedups (and of the
  wall speed-ups),
  drafting share = geometric mean over prompts of the system's decode tokens/s over ours with
  ``tree_budget=0`` (system ``budget0``: our forward, no drafts; what a GPU user gains, where
  our CPU matmul's lead over MKL does not count; for ``static`` over ``static_budget0``,
  ``SHARE_BASES``), over HF static = the same ratio over HF's static cache (``hf_compiled``,
  compiled on a GPU), accepted tokens per step = all emitted
  tokens / all tree steps, nodes per step likewise, time drafting = all drafting time / all
  decode time (our statistics), identical rate = share of runs whose output tensor equals
  HF greedy's (in bfloat16 / float16 also the share exact by the near-tie rule,
  ``exactness``, where the two differ);
- fresh process (``tools.bench.fresh``): per workload, one prompt as the first
  ``generate`` call of a new process, ours (the README line) and plain HF
  greedy each in their own; first-call ratio = plain call wall / ours call
  wall, overall the geometric mean of the workloads' ratios.

Systems are labelled by kind: HF's, ``ours: ... (README call)`` (exactly the
README's lines, default options) and ``diagnostic: ...`` (explicit
``drafters=``, which no README line passes).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from retrieval_draft.atomic import atomic_path, atomic_write_bytes
from tools.bench.cache_state import describe
from tools.bench.fresh import fresh_section

OVERALL = "overall"


def _device(config: dict) -> str:
    """Where and in what dtype the model ran (older results: CPU, float32)."""
    device, dtype = config.get("device", "cpu"), config.get("dtype", "float32")
    where = "CPU" if device == "cpu" else device
    source = f", prompts from {config['prompts_from']}" if config.get("prompts_from") else ""
    return f"{where} in {dtype}{source}"


def machine_info() -> dict:
    """CPU, cores, torch threads, library versions, date and load average."""
    import numpy
    import torch
    import transformers

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {
        "cpu": cpu,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_avg_start": load_average(),
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS") if k in os.environ},
    }


def write_results(prefix: str | Path, result: dict, report: str) -> None:
    """PREFIX.json (``result``) and PREFIX.md (``report``), each written atomically; prints the report.
    The extensions are appended to the whole prefix: a dot inside it (``qwen2.5-coder-0.5b-...``) is
    part of the name."""
    print(report)
    out = Path(prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out.with_name(out.name + ".json"), (json.dumps(result, indent=2) + "\n").encode())
    atomic_write_bytes(out.with_name(out.name + ".md"), report.encode())


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where unknown)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def geomean(values: list[float]) -> float:
    """Geometric mean of positive numbers (nan when empty)."""
    if not values:
        return float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def per_prompt(runs: list[dict], baseline: str = "hf") -> list[dict]:
    """One row per (workload, prompt, system): median tokens/s over repeats and speedup."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        groups[(run["workload"], run["prompt_id"], run["system"])].append(run)
    medians = {key: statistics.median(r["tokens_per_s"] for r in rows) for key, rows in groups.items()}
    walls = {key: statistics.median(r["wall_s"] for r in rows) for key, rows in groups.items()}
    rows = []
    for (workload, prompt_id, system), group in groups.items():
        base = medians.get((workload, prompt_id, baseline))
        base_wall = walls.get((workload, prompt_id, baseline))
        zero = medians.get((workload, prompt_id, SHARE_BASES.get(system, SHARE_BASE))) if group[0]["stats"] is not None else None
        compiled = medians.get((workload, prompt_id, COMPILED_BASE))
        rows.append(
            {
                "workload": workload,
                "prompt_id": prompt_id,
                "system": system,
                "tokens_per_s": round(medians[(workload, prompt_id, system)], 3),
                "speedup": round(medians[(workload, prompt_id, system)] / base, 4) if base else None,
                "wall_speedup": round(base_wall / walls[(workload, prompt_id, system)], 4) if base_wall else None,
                "share": round(medians[(workload, prompt_id, system)] / zero, 4) if zero else None,
                "over_compiled": round(medians[(workload, prompt_id, system)] / compiled, 4) if compiled else None,
                "new_tokens": group[0]["new_tokens"],
                "repeats": len(group),
            }
        )
    return rows


def summarize(runs: list[dict], prompt_rows: list[dict]) -> dict:
    """Per workload (and ``overall``) per system: the summary numbers of the module docstring."""
    out: dict[str, dict] = defaultdict(dict)
    workloads = sorted({r["workload"] for r in runs}, key=[r["workload"] for r in runs].index)
    systems = sorted({r["system"] for r in runs}, key=[r["system"] for r in runs].index)
    for workload in [*workloads, OVERALL]:
        for system in systems:
            chosen_runs = [r for r in runs if r["system"] == system and workload in (OVERALL, r["workload"])]
            chosen_rows = [r for r in prompt_rows if r["system"] == system and workload in (OVERALL, r["workload"])]
            out[workload][system] = _summary(chosen_runs, chosen_rows)
    return dict(out)


SHARE_BASE = "budget0"  # the drafting share: a system's decode speed over ours with tree_budget=0
SHARE_BASES = {"static": "static_budget0", "static_budget0": "static_budget0"}  # static steps: over static, no drafts
COMPILED_BASE = "hf_compiled"  # HF's static cache, compiled on a GPU: what a speed-conscious GPU user runs


def derive(result: dict) -> None:
    """Set ``result``'s per-prompt rows and summary from its runs (unavailable systems say why)."""
    result["per_prompt"] = per_prompt(result["runs"])
    result["summary"] = summarize(result["runs"], result["per_prompt"])
    for systems in result["summary"].values():
        systems.update({name: {"status": reason} for name, reason in result["unavailable"].items()})


def _summary(runs: list[dict], rows: list[dict]) -> dict:
    """Summary numbers over one set of runs and their per-prompt rows."""
    stats = [r["stats"] for r in runs if r["stats"]]
    steps = sum(s["steps"] for s in stats)
    decode = sum(s["decode_s"] for s in stats)
    speedups = [r["speedup"] for r in rows if r["speedup"]]
    wall_speedups = [r["wall_speedup"] for r in rows if r["wall_speedup"]]
    shares = [r["share"] for r in rows if r.get("share")]
    over_compiled = [r["over_compiled"] for r in rows if r.get("over_compiled")]
    nodes = sum(s["tree_nodes"] for s in stats if "tree_nodes" in s)
    return {
        "prompts": len(rows),
        "runs": len(runs),
        "tokens_per_s": round(statistics.fmean(r["tokens_per_s"] for r in rows), 3) if rows else None,
        "speedup_geomean": round(geomean(speedups), 4) if speedups else None,
        "wall_speedup_geomean": round(geomean(wall_speedups), 4) if wall_speedups else None,
        "mean_accepted": round(sum(s["step_tokens"] for s in stats) / steps, 3) if steps else None,
        "share_geomean": round(geomean(shares), 4) if shares else None,
        "over_compiled_geomean": round(geomean(over_compiled), 4) if over_compiled else None,
        "nodes_per_step": round(nodes / steps, 3) if steps and nodes else None,
        "draft_share": round(sum(s["draft_s"] for s in stats) / decode, 4) if decode else None,
        "identical_rate": _rate([r["identical"] for r in runs]),
        "exact_rate": _rate([r.get("exact", r["identical"]) for r in runs]),
    }


def _rate(flags: list) -> float | None:
    """Share of True among the flags that are not None (None when none is)."""
    known = [flag for flag in flags if flag is not None]
    return round(sum(known) / len(known), 4) if known else None


def _fmt(value, spec: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def _busy_note(result: dict) -> str:
    """A warning when other processes competed for the cores during the timed runs.

    The 1-minute load average counts our own torch threads too, so the
    machine counts as busy when it exceeds torch threads + 1.
    """
    machine = result["machine"]
    loads = [r["load_1m"] for r in result["runs"] if r.get("load_1m") is not None]
    if not loads or max(loads) <= machine["torch_threads"] + 1:
        return ""
    note = " — **the machine was busy: other processes competed for the cores, timings are noisy**"
    if machine.get("env", {}).get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        note += " (spinning OpenMP threads make a busy machine far slower; consider OMP_WAIT_POLICY=PASSIVE)"
    return note


def _load_range(result: dict) -> str:
    loads = sorted(r["load_1m"] for r in result["runs"] if r.get("load_1m") is not None)
    return f"{loads[0]}..{loads[-1]} (median {loads[len(loads) // 2]})" if loads else "unknown"


def _pct(value) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def summary_table(result: dict) -> str:
    """The per-workload markdown table; unavailable systems say why."""
    lines = [
        "| workload | system | decode tok/s | speedup vs HF (geomean) | drafting share (over tree_budget=0) "
        "| vs HF static cache | wall speed-up, prefill included | accepted/step | nodes/step | time drafting | identical |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    labels = result["labels"]
    for workload, systems in result["summary"].items():
        for system in result["config"]["systems"]:
            reason = result["unavailable"].get(system)
            if reason:
                lines.append(f"| {workload} | {labels[system]} | {reason} | {reason} | | | | | | | |")
                continue
            s = systems[system]
            rate = "n/a" if s["identical_rate"] is None else f"{100 * s['identical_rate']:.0f}%"
            if s.get("exact_rate") not in (None, s["identical_rate"]):  # reduced precision: near-ties judged
                rate += f" ({100 * s['exact_rate']:.0f}% exact)"
            lines.append(
                f"| {workload} | {labels[system]} | {_fmt(s['tokens_per_s'], '.1f')} | "
                f"{_fmt(s['speedup_geomean'], '.2f')}x | {_fmt(s.get('share_geomean'), '.2f', '')}"
                f"{'x' if s.get('share_geomean') else ''} | {_fmt(s.get('over_compiled_geomean'), '.2f', '')}"
                f"{'x' if s.get('over_compiled_geomean') else ''} | {_fmt(s['wall_speedup_geomean'], '.2f')}x | "
                f"{_fmt(s['mean_accepted'], '.2f', '')} | {_fmt(s.get('nodes_per_step'), '.1f', '')} | "
                f"{_pct(s['draft_share'])} | {rate} |"
            )
    return "\n".join(lines)


def speedup_table(result: dict) -> str:
    """Workloads x systems: geometric-mean speedup over HF, the fresh-process first-call ratio beside."""
    others = [s for s in result["config"]["systems"] if s != "hf"]
    fresh = result.get("fresh_process") or {}
    by_workload = {row["workload"]: row["ratio"] for row in fresh.get("rows", [])}
    fresh_column = bool(by_workload)
    labels = [result["labels"][s] for s in others] + (["ours: first call, fresh process"] if fresh_column else [])
    lines = ["| workload | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for workload, systems in result["summary"].items():
        cells = []
        for system in others:
            reason = result["unavailable"].get(system)
            cells.append(reason or _fmt(systems[system]["speedup_geomean"], ".2f") + "x")
        if fresh_column:
            ratio = fresh.get("ratio_geomean") if workload == OVERALL else by_workload.get(workload)
            cells.append(_fmt(ratio, ".2f") + "x")
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def prompt_table(result: dict) -> str:
    """Per-prompt speedups against HF ``generate`` (HF's own column in tokens/s)."""
    systems = [s for s in result["config"]["systems"] if s not in result["unavailable"]]
    others = [s for s in systems if s != "hf"]
    lines = [
        "| workload | prompt | prompt tokens | new tokens | HF tok/s | " + " | ".join(others) + " |",
        "|---|---|---:|---:|---:|" + "---:|" * len(others),
    ]
    rows = {(r["workload"], r["prompt_id"], r["system"]): r for r in result["per_prompt"]}
    for prompt in result["prompts"]:
        key = (prompt["workload"], prompt["prompt_id"])
        base = rows.get((*key, "hf"))
        cells = [_fmt(rows[(*key, s)]["speedup"], ".2f") + "x" if (*key, s) in rows else "" for s in others]
        lines.append(
            f"| {key[0]} | {key[1]} | {prompt['prompt_tokens']} | {base['new_tokens'] if base else ''} | "
            f"{_fmt(base and base['tokens_per_s'], '.1f')} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The whole report: header with machine and settings, summary table, per-prompt table."""
    m, c = result["machine"], result["config"]
    mode = f"sampling, temperature {c['temperature']}" if c["sampling"] else "greedy"
    return "\n".join(
        [
            f"# retrieval-draft benchmark ({mode})",
            "",
            f"`{result.get('command', 'python -m tools.bench')}`",
            "",
            f"- machine: {m['cpu']}, {m['cores']} cores{', ' + m['gpu'] if m.get('gpu') else ''}, torch threads {m['torch_threads']}; "
            f"torch {m['torch']}, transformers {m['transformers']}, Python {m['python']}; {m['date']}",
            f"- {describe(result.get('cache'))}",
            f"- 1-minute load average during the timed runs {_load_range(result)} (our own threads count); "
            f"environment {m['env'] or 'no OMP/MKL variables'}{_busy_note(result)}",
            f"- model: {Path(c['model']).name} on {_device(c)}; {c['max_new_tokens']} new tokens; {c['repeats']} repeats (median), "
            f"systems interleaved per prompt with the order rotated; seed {c['seed']}",
            f"- our plugin: {c['plugin_kwargs'] or 'defaults'} (defaults {c['plugin_defaults']}); "
            f"datastore: {c['datastore'] or 'none'} ({c['datastore_status']}); "
            f"warm output history: {c.get('history') or 'none'}",
            f"- code: commit {str(c['code']['commit'])[:10]}, {c['code']['changed_files']} files changed or untracked",
            f"- untimed warm-up: {c.get('warm_up', 'every system, 8 tokens (older harness)')} "
            f"({', '.join(f'{k} {v:.2f} s' for k, v in result.get('warmup_s', {}).items()) or 'not timed'}); "
            f"plugin memory: {c.get('model_handles', 'one model object shared by all systems (older harness)')}",
            f"- decode tok/s = new tokens / (wall - prefill); wall time {result['elapsed_s']:.0f} s",
            "",
            "## Speedup over HF greedy generate (geometric mean over prompts)",
            "",
            speedup_table(result),
            "",
            *fresh_section(result),
            "## Per workload and system",
            "",
            summary_table(result),
            "",
            "## Speedup per prompt (median of repeats, against HF generate)",
            "",
            prompt_table(result),
            "",
        ]
    )


def figure(**subplots):
    """(figure, axes) of ``matplotlib.pyplot.subplots(**subplots)`` on the Agg backend: the benchmark's
    charts are drawn this way and written by ``save_png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(**subplots)


def save_png(fig, path: str | Path) -> None:
    """Write ``fig`` as a PNG at ``path`` (atomically, 110 dpi) and close it."""
    import matplotlib.pyplot as plt

    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")
    plt.close(fig)


def plot(result: dict, path: str) -> None:
    """A PNG of geometric-mean speedups per workload and system (``figure``, ``save_png``)."""
    systems = [s for s in result["config"]["systems"] if s not in result["unavailable"]]
    workloads = list(result["summary"])
    series = {result["labels"][s]: [result["summary"][w][s]["speedup_geomean"] or 0.0 for w in workloads]
              for s in systems}
    fresh = result.get("fresh_process") or {}
    if fresh.get("rows"):
        ratios = {row["workload"]: row["ratio"] for row in fresh["rows"]}
        ratios[OVERALL] = fresh.get("ratio_geomean")
        series["ours: first call, fresh process"] = [ratios.get(w) or 0.0 for w in workloads]
    width = 0.8 / max(len(series), 1)
    fig, ax = figure(figsize=(max(6, 1.6 * len(workloads)), 4))
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(workloads))], values, width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    top = max((v for values in series.values() for v in values), default=1.0)
    ax.set_ylim(0, max(top, 1.0) * 1.3)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(workloads))], workloads)
    ax.set_ylabel("speedup vs HF generate, geomean\n(decode; fresh process: whole first call)", fontsize=8)
    m = result["machine"]
    ax.set_title(f"{result['config']['model_short']}, {m['cores']} cores, {m['torch_threads']} threads", fontsize=9)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    save_png(fig, path)

