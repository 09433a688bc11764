"""The repo-completion workloads: deterministic prompts, held-out files kept out of their stores, stores cached."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import retrieval_draft_datastore.repo_store as repo_store_module
from retrieval_draft.store.manifest import read_manifest
from retrieval_draft_datastore.repo_cache import load_previous
from tests.datastore_fixtures import bpe_tokenizer
from tools.bench.repo_workloads import RepoSource, held_out_functions, package_dir, repo_prompts
from tools.bench.systems import readme_datastore

SMALL = (RepoSource("pluggy", "_manager.py"),)  # a small pure-Python package of the venv (~75 kB)


@pytest.fixture(scope="module")
def tokenizer():
    folder = package_dir("pluggy")
    return bpe_tokenizer([p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.py"))], vocab_size=400)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tokenizer):
    """(cache root, raw prompts) after one build."""
    root = tmp_path_factory.mktemp("repo-stores")
    return root, repo_prompts(4, 0, False, tokenizer, SMALL, root)


def test_prompts_are_the_same_on_every_build_and_n_takes_a_prefix(built, tokenizer):
    root, first = built
    again = repo_prompts(4, 0, False, tokenizer, SMALL, root)
    assert again == first and len(first) == 4
    assert repo_prompts(2, 0, False, tokenizer, SMALL, root) == first[:2]
    assert len({p.prompt_id for p in first}) == 4


def test_a_raw_prompt_is_the_file_up_to_a_docstring_with_the_body_left_out(built):
    _, prompts = built
    text = (package_dir("pluggy") / "_manager.py").read_text(encoding="utf-8")
    functions = {f.qualname: f for f in held_out_functions(text)}
    for prompt in prompts:
        function = functions[prompt.prompt_id.split(":", 1)[1]]
        assert prompt.text == function.prefix and not prompt.chat
        assert prompt.text.rstrip().endswith(('"""', "'''"))
        rest = text[text.index(prompt.text) + len(prompt.text):]
        assert len(rest.split("\n", 3)) == 4 and rest.strip()  # the body follows, outside the prompt


def test_chat_prompts_ask_for_the_same_functions_by_signature_and_docstring(built, tokenizer):
    root, raw = built
    chat = repo_prompts(4, 0, True, tokenizer, SMALL, root)
    assert [p.prompt_id for p in chat] == [p.prompt_id for p in raw]
    for prompt in chat:
        name = prompt.prompt_id.rsplit(".", 1)[-1].split(":")[-1]
        assert prompt.chat and f"def {name}(" in prompt.text and prompt.text.startswith("Complete this function")


def test_the_held_out_file_is_not_in_the_store_and_the_rest_of_the_package_is(built):
    _, prompts = built
    store = prompts[0].store
    assert {p.store for p in prompts} == {store}
    held = package_dir("pluggy") / "_manager.py"
    files = load_previous(Path(store), read_manifest(Path(store))).hashes
    assert "_manager.py" not in files
    assert hashlib.sha256(held.read_bytes()).hexdigest() not in files.values()
    assert {"_hooks.py", "_callers.py", "__init__.py"} <= set(files)


def test_a_cached_store_is_reused_without_building(built, tokenizer, monkeypatch):
    root, first = built

    def no_build(*args, **kwargs):
        raise AssertionError("the store was built again")

    monkeypatch.setattr(repo_store_module, "update_repo_store", no_build)
    assert repo_prompts(4, 0, False, tokenizer, SMALL, root) == first


def test_the_datastore_systems_pass_the_repo_store_first():
    assert readme_datastore("repo", "general") == ["repo", "general"]
    assert readme_datastore(None, "general") == "general"
    assert readme_datastore("repo", None) is None


def test_standard_library_packages_are_refused():
    with pytest.raises(ValueError, match="site-packages"):
        package_dir("json")
