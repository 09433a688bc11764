"""The fresh-process measurement: one README call as the first call of a new Python process.

Per workload, its first prompt runs twice, each in a new interpreter
(``sys.executable -m tools.bench.first_call`` from the repository root, which imports, loads the model and
times one ``generate`` call with nothing warmed up):

- ours: ``model.generate(**inputs, max_new_tokens=N, custom_generate=retrieval_draft.generate)``,
  with ``datastore=PATH, draft_tokenizer=tokenizer`` when the bench has ``--datastore``;
- plain: ``model.generate(**inputs, max_new_tokens=N, do_sample=False)``.

The two run one after the other (order alternating by workload) while the
bench process sits idle. first-call ratio = plain ``generate`` wall seconds /
ours ``generate`` wall seconds (import and model loading are recorded apart,
not in the ratio); identical = the two processes' new token ids are equal.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

from tools.bench.systems import readme_datastore

REPO = Path(__file__).resolve().parents[2]  # the fresh processes run ``-m tools.bench.first_call`` from here
TIMEOUT_S = 900  # one subprocess: ~15 s import + load, a few s per 128 tokens; generous for a busy machine


def first_call_command(system: str, args, datastore: str | list[str] | None) -> list[str]:
    """The command line of one fresh-process run (``system`` "ours" or "hf"), run from ``REPO``;
    existing relative paths are made absolute, since the process starts there. ``datastore``:
    one path or a list (one ``--datastore`` each)."""
    command = [sys.executable, "-m", "tools.bench.first_call", "--system", system]
    command += ["--max-new-tokens", str(args.max_new_tokens)]
    if args.model:
        command += ["--model", _absolute(args.model)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.sampling:
        command += ["--temperature", str(args.temperature), "--seed", str(args.seed)]
    if system == "ours" and datastore is not None:
        for path in [datastore] if isinstance(datastore, str) else datastore:
            command += ["--datastore", _absolute(path)]
    return command


def _absolute(path: str) -> str:
    """``path`` made absolute when it names something here; otherwise unchanged."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def run_first_call(command: list[str], input_ids: list[int]) -> dict:
    """Run one subprocess from the repository root; its JSON record plus ``process_s``
    (spawn to exit, seconds), or ``{"error": ...}``."""
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, input=json.dumps({"input_ids": input_ids}), capture_output=True, text=True,
            timeout=TIMEOUT_S, cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT_S} s"}
    process_s = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"[:300]}
    record = json.loads(lines[-1])
    record["process_s"] = round(process_s, 3)
    return record


def fresh_process_rows(args, prompts, encoded, log=print) -> list[dict]:
    """One row per workload (its first prompt): both subprocess records, the ratio and identical."""
    rows, seen = [], set()
    for prompt, ids in zip(prompts, encoded):
        if prompt.workload in seen:
            continue
        seen.add(prompt.workload)
        order = ("hf", "ours") if len(seen) % 2 else ("ours", "hf")
        records = {}
        for system in order:
            datastore = readme_datastore(prompt.store, args.datastore)
            records[system] = run_first_call(first_call_command(system, args, datastore), ids[0].tolist())
        rows.append(fresh_row(prompt, records, args.sampling))
        log(f"[bench] fresh process {prompt.workload}/{prompt.prompt_id}: {describe(rows[-1])}")
    return rows


def fresh_row(prompt, records: dict, sampling: bool) -> dict:
    """The report row of one workload from the ``hf`` and ``ours`` subprocess records."""
    ours, hf = records["ours"], records["hf"]
    ok = "error" not in ours and "error" not in hf
    identical = None if sampling or not ok else ours["output_ids"] == hf["output_ids"]
    strip = lambda r: {k: v for k, v in r.items() if k != "output_ids"}  # noqa: E731
    return {
        "workload": prompt.workload,
        "prompt_id": prompt.prompt_id,
        "ours": strip(ours),
        "hf": strip(hf),
        "ratio": round(hf["generate_s"] / ours["generate_s"], 4) if ok else None,
        "identical": identical,
    }


def describe(row: dict) -> str:
    """One progress line: both call walls and the ratio, or the error."""
    if row["ratio"] is None:
        return "; ".join(f"{s}: {row[s]['error']}" for s in ("hf", "ours") if "error" in row[s])
    return (
        f"plain {row['hf']['generate_s']:.2f} s, ours {row['ours']['generate_s']:.2f} s, "
        f"ratio {row['ratio']:.2f}x, identical {row['identical']}"
    )


def fresh_geomean(rows: list[dict]) -> float | None:
    """Geometric mean of the first-call ratios (None when there are none)."""
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    return round(math.exp(sum(math.log(x) for x in ratios) / len(ratios)), 4) if ratios else None


def fresh_table(result: dict) -> str:
    """Markdown table of the fresh-process rows (empty string when not measured)."""
    fresh = result.get("fresh_process") or {}
    if not fresh.get("rows"):
        return ""
    lines = [
        "| workload | prompt | new tokens | import s | load s | plain first call s | ours first call s | "
        "first-call ratio (plain/ours) | accepted/step | identical |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in fresh["rows"]:
        ours, hf = row["ours"], row["hf"]
        if row["ratio"] is None:
            lines.append(f"| {row['workload']} | {row['prompt_id']} | {describe(row)} | | | | | | | |")
            continue
        accepted = (ours.get("stats") or {}).get("mean_accepted")
        same = "n/a" if row["identical"] is None else ("yes" if row["identical"] else "**no**")
        lines.append(
            f"| {row['workload']} | {row['prompt_id']} | {ours['new_tokens']} | "
            f"{ours['import_s']:.1f} / {hf['import_s']:.1f} | {ours['load_s']:.1f} / {hf['load_s']:.1f} | "
            f"{hf['generate_s']:.2f} | {ours['generate_s']:.2f} | {row['ratio']:.2f}x | "
            f"{'' if accepted is None else f'{accepted:.2f}'} | {same} |"
        )
    return "\n".join(lines)


def fresh_section(result: dict) -> list[str]:
    """The markdown lines of the fresh-process section (none when it was not run)."""
    fresh = result.get("fresh_process") or {}
    if not fresh.get("rows"):
        return [f"Fresh process: {fresh.get('status', 'not run')}.", ""]
    return [
        "## First call in a fresh process (one prompt per workload)",
        "",
        f"Each call in a new Python process after import and model loading, nothing warmed up: "
        f"ours = `{fresh['call']}`, plain = `model.generate(**inputs, max_new_tokens=N, do_sample=False)`. "
        "Import and load columns: ours / plain. Ratio = plain call wall / ours call wall. What the plugin "
        "keeps on disk between processes (the cost curve) is used as it would be for a user.",
        "",
        fresh_table(result),
        "",
    ]


def readme_call(datastore: str | list[str] | None) -> str:
    """The README line the fresh process times, as text."""
    extra = f", datastore={datastore!r}, draft_tokenizer=tokenizer" if datastore else ""
    return f"model.generate(**inputs, max_new_tokens=N, custom_generate=retrieval_draft.generate{extra})"
