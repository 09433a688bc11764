"""The served model folder (``retrieval_draft.serving.folder``) and what its ``generate`` does, in this
process: no server here (``test_server.py`` drives one over HTTP)."""

from __future__ import annotations

import json
import socket

import pytest
import torch
from transformers import AutoModelForCausalLM

import retrieval_draft
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.serving.folder import lay_out
from retrieval_draft.serving.options import OPTIONS_FILE, ServeOptions, read_options
from retrieval_draft_datastore.cli import main as cli_main
from tests.doc_preamble import tiny_model_folder


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """The doc tests' tiny model (random 2-layer Llama, 400-id BPE tokenizer with a chat template)."""
    return tiny_model_folder(tmp_path_factory.mktemp("tiny"))


def served_model(folder):
    """The served folder's model as ``transformers serve`` loads it (``trust_remote_code``)."""
    return AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True, dtype=torch.float32).eval()


def prompt(length: int = 40, seed: int = 0) -> torch.Tensor:
    """(1, length) ids in the tiny vocabulary, a repeated block (prompt lookup finds drafts)."""
    block = torch.randint(3, 400, (10,), generator=torch.Generator().manual_seed(seed))
    return block.repeat(length // 10 + 1)[None, :length]


def test_a_served_folder_links_the_models_files_and_adds_our_generate_and_options(model_folder, tmp_path):
    options = ServeOptions(tree_budget=8, drafters=("prompt", "history"))
    folder = lay_out(str(model_folder), options, root=tmp_path)
    assert folder.name == "tiny-model"
    linked = {path.name for path in folder.iterdir() if path.is_symlink()}
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= linked
    assert (folder / "custom_generate" / "generate.py").is_file()
    assert (folder / "custom_generate" / "requirements.txt").is_file()
    assert read_options(folder) == options
    assert json.loads((folder / OPTIONS_FILE).read_text())["options"]["tree_budget"] == 8


def test_a_plain_folder_carries_nothing_of_ours(model_folder, tmp_path):
    folder = lay_out(str(model_folder), None, root=tmp_path)
    assert not (folder / "custom_generate").exists() and read_options(folder) is None
    assert (folder / "model.safetensors").is_file()


def test_each_set_of_options_gets_its_own_folder_and_laying_out_again_replaces_it(model_folder, tmp_path):
    first = lay_out(str(model_folder), ServeOptions(tree_budget=8), root=tmp_path)
    again = lay_out(str(model_folder), ServeOptions(tree_budget=8), root=tmp_path)
    other = lay_out(str(model_folder), ServeOptions(tree_budget=4), root=tmp_path)
    assert first == again and first != other
    assert read_options(other).tree_budget == 4 and read_options(first).tree_budget == 8
    assert [path.name for path in first.parent.parent.iterdir() if path.name.startswith(".")] == []  # no temp left


def test_a_config_without_architectures_is_given_its_causal_lm_class(model_folder, tmp_path):
    bare = tmp_path / "converted"
    bare.mkdir()
    for path in model_folder.iterdir():
        (bare / path.name).symlink_to(path)
    body = json.loads((model_folder / "config.json").read_text())
    del body["architectures"]  # as a model converted from GGUF saves it
    (bare / "config.json").unlink()
    (bare / "config.json").write_text(json.dumps(body))
    folder = lay_out(str(bare), ServeOptions(), root=tmp_path / "served")
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert not (folder / "config.json").is_symlink() and "architectures" not in json.loads((bare / "config.json").read_text())


def test_the_folders_generate_is_exact_and_takes_its_options_under_the_callers(model_folder, tmp_path):
    model = served_model(lay_out(str(model_folder), ServeOptions(tree_budget=0), root=tmp_path))
    ids = prompt()
    plain = AutoModelForCausalLM.from_pretrained(str(model_folder), dtype=torch.float32).eval()
    expected = plain.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    folder_options, callers = retrieval_draft.DecodeStats(), retrieval_draft.DecodeStats()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, draft_stats=folder_options)
    assert torch.equal(out, expected)
    assert folder_options.steps > 0 and folder_options.tree_nodes == folder_options.steps  # lone roots: tree_budget=0
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, draft_stats=callers,
                         tree_budget=16, adaptive_tree=False, prefix_cache_bytes=0)
    assert torch.equal(out, expected) and callers.tree_nodes > callers.steps  # the caller's own keywords win


def test_a_call_for_no_new_tokens_reads_the_prompt_into_the_prefix_cache(model_folder, tmp_path):
    model = served_model(lay_out(str(model_folder), ServeOptions(), root=tmp_path))
    ids = prompt(60, seed=1)
    warm = retrieval_draft.DecodeStats()
    read = model.generate(ids[:, :50], attention_mask=torch.ones_like(ids[:, :50]), max_new_tokens=0, draft_stats=warm)
    assert torch.equal(read, ids[:, :50])  # the prompt back, nothing generated
    assert (warm.prefilled_tokens, warm.new_tokens) == (50, 0) and warm.prefix_cache_bytes > 0
    after = retrieval_draft.DecodeStats()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, draft_stats=after)
    assert (after.reused_tokens, after.prefilled_tokens) == (50, 10)
    plain = AutoModelForCausalLM.from_pretrained(str(model_folder), dtype=torch.float32).eval()
    assert torch.equal(out, plain.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False))


def test_a_streamer_gets_the_prompt_and_end_from_a_call_for_no_new_tokens(model_folder, tmp_path):
    from tools.hub_check import RecordingStreamer

    model = served_model(lay_out(str(model_folder), ServeOptions(), root=tmp_path))
    streamer, ids = RecordingStreamer(), prompt(20, seed=2)
    model.generate(ids, max_new_tokens=0, streamer=streamer)
    assert streamer.summary() == (ids[0].tolist(), [], 1, False)


def test_the_public_prefill_refuses_ids_outside_the_vocabulary(model_folder):
    plain = AutoModelForCausalLM.from_pretrained(str(model_folder), dtype=torch.float32).eval()
    with pytest.raises(InvalidInputError):
        retrieval_draft.prefill(plain, torch.tensor([[5, 9999]]))


@pytest.mark.parametrize("flags, says", [
    (["--tree-budget", "-1"], "tree_budget must be an integer in 0..4096"),
    (["--drafters", "prompt,bogus"], "unknown drafters ['bogus']"),
    (["--datastore", "no-such-store"], "no datastore at"),
    (["--plain", "--datastore", "x"], "--plain serves the model without our decoding: drop --datastore"),
    (["--port", "70000"], "--port must be 1..65535"),
    (["--model", "no-such-model"], "model path not found: no-such-model"),
])
def test_bad_serve_options_fail_at_start_in_one_line(flags, says, capsys):
    assert cli_main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1


def test_a_port_in_use_fails_at_start_in_one_line(model_folder, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli_main(["serve", "--model", str(model_folder), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: 127.0.0.1:{port} is in use (pick another with --port)\n"


@pytest.fixture(scope="module")
def stores(model_folder, tmp_path_factory):
    """(a store of the tiny model's tokenizer, one of another tokenizer), both of five stdlib modules."""
    from retrieval_draft.model.models import load_tokenizer
    from retrieval_draft_datastore.builder import build
    from tests.datastore_fixtures import STDLIB_FILES, stdlib_corpus, word_tokenizer

    root = tmp_path_factory.mktemp("stores")
    files = [str(stdlib_corpus(root / "corpus") / name) for name in STDLIB_FILES]
    build(files, root / "ours", load_tokenizer(str(model_folder)), progress=False)
    build(files, root / "other", word_tokenizer(["def", "return", "self", "import"], extra=300), progress=False)
    return root / "ours", root / "other"


def test_every_serve_flag_reaches_the_folders_options(model_folder, stores, capsys):
    argv = ["serve", "--model", str(model_folder), "--datastore", str(stores[0]), "--drafters", "prompt,ngram",
            "--tree-budget", "8", "--max-draft-len", "4", "--fixed-tree", "--prefix-cache-bytes", "0",
            "--host", "127.0.0.1", "--port", "8123", "--device", "cpu", "--layout-only"]
    assert cli_main(argv) == 0
    options = read_options(capsys.readouterr().out.strip())
    assert options == ServeOptions(datastore=(str(stores[0].resolve()),), drafters=("prompt", "ngram"), tree_budget=8,
                                   max_draft_len=4, adaptive_tree=False, prefix_cache_bytes=0)


def test_a_store_of_another_tokenizer_stops_serve_at_start(model_folder, stores, capsys):
    assert cli_main(["serve", "--model", str(model_folder), "--datastore", str(stores[1]), "--layout-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "tokenizer" in err


def test_layout_only_prints_the_folder_a_user_can_serve_with_transformers_serve(model_folder, capsys):
    assert cli_main(["serve", "--model", str(model_folder), "--tree-budget", "8", "--layout-only"]) == 0
    printed = capsys.readouterr().out.strip()
    assert read_options(printed).tree_budget == 8 and printed.endswith("/tiny-model")
