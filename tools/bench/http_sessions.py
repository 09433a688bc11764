"""HTTP session benchmark: an editor and a chat client, through the ``openai`` client, against servers
started by ``retrieval-draft serve``.

    python -m tools.bench.http_sessions [--workloads editor,chat,fim] [--model NAME] [--out PREFIX]

Servers, each its own process started here and loaded before the first request, all on one model:

- ``plain``: ``retrieval-draft serve --plain`` (``transformers serve`` over the plain model folder:
  HF's own greedy ``generate``, no prefix cache);
- ``ours``: ``retrieval-draft serve`` (the README's defaults; prefix cache on);
- ``ours_warm``: the same, and its editor client warms the cache as llama.vim does: before each
  completion it sends the text above the cursor's line with ``max_tokens=0`` (read, nothing
  generated). That request runs while the user types the line, so it is timed apart (``warm_s``)
  and not in the completion's latency.

Workloads (``tools.bench.session_workloads``): the editor (a file typed top to bottom, a 48-token
completion at docstring ends, one import edit near the top), sent to ``/v1/completions`` as text;
the four-turn chat, sent to ``/v1/chat/completions`` with each client's own earlier replies
(``ours_warm`` takes no part: a chat has nothing to warm). Greedy (``temperature=0``). Requests go
in order; at each request every server gets it once, the order rotated. Per request: the round trip
in seconds, the text, whether it equals the plain server's. The ``fim`` workload (``fim_session``: ``/infill``
requests as llama.vim sends them) and the editor add llama.cpp's ``llama-server`` on the model's GGUF
file, plain and with each of its n-gram speculation modes in ``fim_session.LLAMA_SPECS``, warmed as
``ours_warm`` is and sent the editor's text to its own ``/v1/completions``, built at benchmark time
(``llama_server``; reported unavailable, with the reason, where it cannot be built or the model is not a
GGUF file; llama.cpp reads the quantised file, so its answers may differ from the plain server's). Before the sessions the server's
overhead is measured: one-token requests on a one-token prompt (the round trip of a request that
does almost no model work). Writes PREFIX.json and PREFIX.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.bench.fim_session import WARMED, fim_session, llama_peers
from tools.bench.http_servers import openai_client, served
from tools.bench.report import load_average, machine_info, write_results
from tools.bench.session_workloads import CHAT_NEW_TOKENS, CHAT_TURNS, EDITOR_NEW_TOKENS, editor_requests, fim_requests

SERVERS = {"plain": ["--plain"], "ours": [], "ours_warm": []}
WORKLOADS = ("editor", "chat", "fim")
DEFAULT_WORKLOADS = ("editor", "chat")  # fim needs a model with fill-in-the-middle tokens
DEFAULT_OUT = "bench/results/http-sessions"
OVERHEAD_REQUESTS = 5


def timed(function, *args, **kwargs) -> tuple[object, float]:
    """(``function(*args, **kwargs)``, its wall seconds)."""
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def editor_session(clients: dict, model: str, requests, log) -> list[dict]:
    """Every editor request to every server, order rotated, the ``WARMED`` ones (``ours_warm``, llama.cpp's)
    warmed first; one record per (request, server)."""
    records, names = [], list(clients)
    for index, request in enumerate(requests):
        warm_s = {}
        for name in (n for n in names if n in WARMED):  # while the user types the cursor's line
            _, warm_s[name] = timed(clients[name].completions.create, model=model, prompt=request.warm_text,
                                    max_tokens=0, temperature=0)
        texts, walls = {}, {}
        for name in names[index % len(names):] + names[: index % len(names)]:
            answer, walls[name] = timed(clients[name].completions.create, model=model, prompt=request.text,
                                        max_tokens=EDITOR_NEW_TOKENS, temperature=0)
            texts[name] = answer.choices[0].text
        for name in names:
            records.append({"workload": "editor", "request": index, "request_id": request.request_id,
                            "edited": request.edited, "system": name, "wall_s": round(walls[name], 4),
                            "warm_s": round(warm_s[name], 4) if name in warm_s else None,
                            "chars": len(texts[name]), "identical": texts[name] == texts["plain"],
                            "load_1m": (load_average() or [None])[0]})
        log(f"[http] editor #{index}: " + ", ".join(f"{n} {walls[n]:.2f}s" for n in names)
            + "".join(f" (warm {n} {seconds:.2f}s)" for n, seconds in warm_s.items()))
    return records


def chat_session(clients: dict, model: str, log) -> list[dict]:
    """Every chat turn to every server, each with its own earlier replies; one record per (turn, server)."""
    names = [name for name in clients if name not in WARMED]  # a chat has nothing to warm: the warmed servers take no part
    histories = {name: [] for name in names}
    records = []
    for index, turn in enumerate(CHAT_TURNS):
        texts, walls = {}, {}
        for name in names[index % len(names):] + names[: index % len(names)]:
            messages = histories[name] + [{"role": "user", "content": turn}]
            answer, walls[name] = timed(clients[name].chat.completions.create, model=model, messages=messages,
                                        max_tokens=CHAT_NEW_TOKENS, temperature=0)
            texts[name] = answer.choices[0].message.content
            histories[name] = messages + [{"role": "assistant", "content": texts[name]}]
        for name in names:
            records.append({"workload": "chat", "request": index, "request_id": f"turn {index + 1}", "edited": False,
                            "system": name, "wall_s": round(walls[name], 4), "warm_s": None,
                            "chars": len(texts[name]), "identical": texts[name] == texts["plain"],
                            "load_1m": (load_average() or [None])[0]})
        log(f"[http] chat turn {index + 1}: " + ", ".join(f"{n} {walls[n]:.2f}s" for n in names))
    return records


def overhead(client, model: str) -> float:
    """Median round trip of a one-token completion on a one-token prompt, in seconds."""
    walls = [timed(client.completions.create, model=model, prompt="x", max_tokens=1, temperature=0)[1]
             for _ in range(OVERHEAD_REQUESTS)]
    return round(statistics.median(walls), 4)


def summarize(records: list[dict]) -> dict:
    """Per workload and server: the plain server's round trip over its own, per request (median, range),
    over the whole session, and how many answers equal the plain server's."""
    out = {}
    for workload in dict.fromkeys(r["workload"] for r in records):
        rows = {(r["request"], r["system"]): r for r in records if r["workload"] == workload}
        requests = sorted({request for request, _ in rows})
        out[workload] = {}
        for name in dict.fromkeys(system for _, system in rows):
            ratios = [rows[i, "plain"]["wall_s"] / rows[i, name]["wall_s"] for i in requests]
            total = sum(rows[i, "plain"]["wall_s"] for i in requests) / sum(rows[i, name]["wall_s"] for i in requests)
            out[workload][name] = {
                "per_request": [round(x, 3) for x in ratios], "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3), "max": round(max(ratios), 3), "session": round(total, 3),
                "identical": sum(rows[i, name]["identical"] for i in requests), "requests": len(requests),
                "median_s": round(statistics.median(rows[i, name]["wall_s"] for i in requests), 3),
                "total_s": round(sum(rows[i, name]["wall_s"] for i in requests), 3),
            }
    return out


def markdown(result: dict) -> str:
    """The run as a Markdown report: the summary table, then every request."""
    info = result["machine"]
    lines = [f"# HTTP sessions: {result['model']} through `retrieval-draft serve`", "",
             f"{info['date']}, {info['cpu']}, {info['cores']} cores, torch {info['torch']}, transformers "
             f"{info['transformers']}; load average at start {info['load_avg_start']}, at end {result['load_avg_end']}.",
             f"Command: `{result['command']}`. Cache: {result['cache']}.",
             f"Server overhead: a one-token request on a one-token prompt takes {result['overhead_s']['plain']:.3f} s "
             f"round trip on the plain server, {result['overhead_s']['ours']:.3f} s on ours.", "",
             *(f"Unavailable: {name}: {why}." for name, why in result.get("unavailable", {}).items()), "",
             "| workload | server | median s per request | session s | plain over it, median per request (range) | "
             "session | identical |", "|---|---|---:|---:|---:|---:|---:|"]
    for workload, servers in result["summary"].items():
        for name, row in servers.items():
            lines.append(f"| {workload} | {name} | {row['median_s']:.2f} | {row['total_s']:.2f} | {row['median']:.2f}x "
                         f"({row['min']:.2f}-{row['max']:.2f}x) | {row['session']:.2f}x | {row['identical']}/{row['requests']} |")
    lines += ["", "| workload | request | server | seconds | warm-up s | identical | load |", "|---|---|---|---:|---:|---|---:|"]
    for r in result["records"]:
        warm = "" if r["warm_s"] is None else f"{r['warm_s']:.2f}"
        lines.append(f"| {r['workload']} | {r['request_id']}{' (edited)' if r['edited'] else ''} | {r['system']} | "
                     f"{r['wall_s']:.2f} | {warm} | {'yes' if r['identical'] else 'NO'} | {r['load_1m']} |")
    return "\n".join(lines) + "\n"


def model_gguf(model: str | None) -> Path | None:
    """The GGUF file ``model`` (a name or a path) is read from, or None when it is not one."""
    from retrieval_draft.model.models import model_location

    folder, extra = model_location(model)
    return Path(folder) / extra["gguf_file"] if "gguf_file" in extra else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.http_sessions", description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help=f"comma list of {', '.join(WORKLOADS)} (default: {','.join(DEFAULT_WORKLOADS)})")
    parser.add_argument("--model", default="smollm2-135m", help="the model every server loads (a name or a path)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="results prefix (writes PREFIX.json and PREFIX.md)")
    args = parser.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown or not workloads:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    from retrieval_draft.cache_dir import cache_root
    from retrieval_draft.model.models import load_tokenizer
    from retrieval_draft.serving.folder import served_name

    if "fim" in workloads:
        from retrieval_draft.errors import NoFillInMiddleError
        from retrieval_draft.serving.fim import fim_template

        try:
            fim_template(load_tokenizer(args.model), served_name(args.model))
        except NoFillInMiddleError as error:
            parser.error(str(error))
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    requests = editor_requests(load_tokenizer(args.model)) if "editor" in workloads else []
    names = list(SERVERS) if "editor" in workloads or "fim" in workloads else ["plain", "ours"]
    starts, envs = [[*SERVERS[n], "--model", args.model] for n in names], [None] * len(names)
    peers, unavailable = llama_peers(model_gguf(args.model)) if {"editor", "fim"} & set(workloads) else ({}, {})
    for name, (start, env) in peers.items():
        names, starts, envs = [*names, name], [*starts, start], [*envs, env]
    model = served_name(args.model)
    with tempfile.TemporaryDirectory() as logs, served(*starts, logs=Path(logs), envs=envs) as servers:
        by_name = dict(zip(names, servers))
        clients = {name: openai_client(by_name[name]) for name in names}  # llama-server speaks /v1/completions too
        info = machine_info()
        costs = {name: overhead(clients[name], model) for name in ("plain", "ours")}
        records = []
        if "editor" in workloads:
            records += editor_session(clients, model, requests, log)
        if "chat" in workloads:
            records += chat_session(clients, model, log)
        if "fim" in workloads:
            records += fim_session(by_name, fim_requests(), log)
    result = {"model": args.model, "machine": info, "command": "python -m tools.bench.http_sessions " + " ".join(argv or sys.argv[1:]),
              "cache": f"the user cache at {cache_root()} as this machine left it (cost curve and rates lived-in); "
                       "each server starts with an empty prefix cache",
              "overhead_s": costs, "unavailable": unavailable, "records": records, "summary": summarize(records), "load_avg_end": load_average()}
    write_results(args.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
