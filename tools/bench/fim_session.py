"""The FIM editor session over HTTP: ``/infill`` requests as llama.vim sends them, to our server, HF's
plain one and llama.cpp's ``llama-server`` on the same GGUF file.

Every request (``session_workloads.fim_requests``) goes to every server in turn, the order rotated;
the servers in ``WARMED`` first get the warming request, as llama.vim warms llama.cpp's server while
its user types the cursor's line (the prefix less that line, ``n_predict: 0``: read into the cache,
nothing generated; timed apart, ``warm_s``). Greedy: ``temperature: 0`` (llama.cpp's default is
0.8). Per (request, server): the round trip in seconds, the middle's length, whether it equals the
plain server's (llama.cpp runs the quantised file, our servers its float32 conversion, so its middles
may differ), and the tokens each server says it generated.

``llama_peers`` names the llama.cpp servers to start on the model's GGUF file (plain, and with the
n-gram speculation in ``LLAMA_SPECS``), or why they cannot run here (``llama_server.binary``).
"""

from __future__ import annotations

import time
from pathlib import Path

from tools.bench.http_servers import Server, post_json
from tools.bench.llama_server import binary, command, environment
from tools.bench.peers import PeerUnavailable
from tools.bench.report import load_average
from tools.bench.session_workloads import FIM_NEW_TOKENS, FimRequest

# llama.cpp plain, and its n-gram modes that were best here: ngram-simple on Qwen2.5-Coder's FIM session,
# ngram-mod on SmolLM2's editor session (issue 75's measurements by hand)
LLAMA_SPECS = (None, "ngram-simple", "ngram-mod")
WARMED = ("ours_warm", *(f"llama_{spec}" if spec else "llama" for spec in LLAMA_SPECS))


def infill_body(before: str, after: str, n_predict: int) -> dict:
    """An ``/infill`` body as llama.vim sends it, greedy."""
    return {"input_prefix": before, "input_suffix": after, "input_extra": [], "n_predict": n_predict,
            "temperature": 0, "cache_prompt": True, "stream": False}


def fim_session(servers: dict[str, Server], requests: list[FimRequest], log) -> list[dict]:
    """Every request to every server of ``servers`` (name -> running server; ``plain`` among them),
    order rotated, the ``WARMED`` ones warmed first; one record per (request, server)."""
    names, records = list(servers), []
    for index, request in enumerate(requests):
        warm_s = {}
        for name in (n for n in names if n in WARMED):
            started = time.perf_counter()
            post_json(servers[name], "/infill", infill_body(request.warm_before, request.after, 0))
            warm_s[name] = time.perf_counter() - started
        answers, walls = {}, {}
        for name in names[index % len(names):] + names[: index % len(names)]:
            started = time.perf_counter()
            answers[name] = post_json(servers[name], "/infill", infill_body(request.before, request.after, FIM_NEW_TOKENS))
            walls[name] = time.perf_counter() - started
        for name in names:
            records.append({"workload": "fim", "request": index, "request_id": request.request_id, "edited": False,
                            "system": name, "wall_s": round(walls[name], 4),
                            "warm_s": round(warm_s[name], 4) if name in warm_s else None,
                            "chars": len(answers[name]["content"]), "tokens": answers[name].get("tokens_predicted"),
                            "identical": answers[name]["content"] == answers["plain"]["content"],
                            "load_1m": (load_average() or [None])[0]})
        log(f"[http] fim #{index}: " + ", ".join(f"{n} {walls[n]:.2f}s" for n in names))
    return records


def llama_peers(gguf: Path | None) -> tuple[dict[str, tuple], dict[str, str]]:
    """({name: (argv callable, environment)} of the llama.cpp servers to start on ``gguf``,
    {name: why it cannot run}); ``gguf`` None: the model has no GGUF file to give it."""
    names = [f"llama_{spec}" if spec else "llama" for spec in LLAMA_SPECS]
    if gguf is None:
        return {}, {name: "the model is not a GGUF file: llama.cpp serves only those" for name in names}
    try:
        server = binary()
    except PeerUnavailable as error:
        return {}, {name: f"llama-server cannot be built here: {error}" for name in names}
    return {name: (command(server, gguf, spec), environment(server)) for name, spec in zip(names, LLAMA_SPECS)}, {}
