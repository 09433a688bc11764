"""Servers started by ``retrieval-draft serve`` (or a peer's, ``llama_server``) as a client meets
them: a process on a free port.

``served`` starts one (``python -m retrieval_draft_datastore.cli serve ...``, the console script's
module) with its output in a log file, waits until ``/health`` answers, and stops it (Ctrl-C, then
kill) when the block ends. ``openai_client`` is the ``openai`` package's client for it. Used by the
HTTP session benchmark (``tools.bench.http_sessions``) and the server tests.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

HOST = "127.0.0.1"
READY_TIMEOUT_S = 600  # loading a model and importing the server on a busy 2-core machine


@dataclass(frozen=True)
class Server:
    """A running server: its port, base URL (``.../v1``), process and log file."""

    port: int
    process: subprocess.Popen
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def free_port() -> int:
    """A TCP port on ``HOST`` that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def start(args, log: Path, env: dict | None = None) -> Server:
    """Start ``retrieval-draft serve ARGS --host HOST --port <free>`` (``args``: a list of strings), or
    another server (``args``: a callable ``(host, port) -> argv``, e.g. ``llama_server.command``),
    logging to ``log``; returns at once."""
    port = free_port()
    if callable(args):
        command = args(HOST, port)
    else:
        command = [sys.executable, "-m", "retrieval_draft_datastore.cli", "serve", *args, "--host", HOST,
                   "--port", str(port)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    return Server(port, process, log)


def wait_ready(server: Server, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Block until ``server`` answers ``/health``; ``RuntimeError`` with its log's tail if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with {server.process.returncode}:\n{server.log_text()[-3000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://{HOST}:{server.port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"the server did not answer within {timeout_s:.0f} s:\n{server.log_text()[-3000:]}")


def stop(server: Server) -> None:
    """Ctrl-C the server, then kill it if it has not ended within 20 s."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGINT)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@contextlib.contextmanager
def served(*arg_lists, logs: Path, env: dict | None = None, envs: list[dict | None] | None = None) -> Iterator[list[Server]]:
    """Servers for each of ``arg_lists`` (as ``start`` takes them; started together, all ready on
    entry), stopped on exit; ``logs``: the folder of their log files (``server-<i>.log``); ``envs``:
    one environment per server, in place of ``env`` for all."""
    servers: list[Server] = []
    try:
        for index, args in enumerate(arg_lists):
            servers.append(start(args, logs / f"server-{index}.log", envs[index] if envs else env))
        for server in servers:
            wait_ready(server)
        yield servers
    finally:
        for server in servers:
            stop(server)


def post_json(server: Server, path: str, body: dict, timeout_s: float = 600) -> dict:
    """The JSON answer of ``server`` to ``body`` POSTed to ``path`` (``/infill``); ``urllib.error.HTTPError``
    on an error status."""
    request = urllib.request.Request(f"http://{HOST}:{server.port}{path}", data=json.dumps(body).encode("utf-8"),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        return json.loads(answer.read())


def openai_client(server: Server, timeout_s: float = 600):
    """The ``openai`` package's client for ``server`` (no key needed; no retries, so an error shows)."""
    from openai import OpenAI

    return OpenAI(base_url=server.base_url, api_key="not-needed", timeout=timeout_s, max_retries=0)
