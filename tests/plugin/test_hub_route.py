"""The Hub route: ``generate(custom_generate=<the hub/retrieval-draft folder>, trust_remote_code=True)``.

transformers loads ``custom_generate/generate.py`` from the folder by path, as it would
from a Hub repository, and calls it with all of ``generate``'s arguments. These tests
hold that the folder decodes exactly like plain greedy ``generate`` (``stop_strings``
included), passes HF's ``streamer`` on (as the callable route does too), lets our options
reach the engine, and fails with a typed error naming the package when it is missing. The dynamic-module cache that
transformers copies the file into is this module's own.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import sys

import pytest
import torch
import transformers.dynamic_module_utils as dynamic_module_utils
from transformers import TextStreamer

import retrieval_draft
from retrieval_draft.drafters.oracle import OracleDrafter
from retrieval_draft.errors import InvalidInputError
from tests.conftest import TINY_VOCAB, random_prompt
from tests.datastore_fixtures import bpe_tokenizer, word_tokenizer
from tools.hub_check import FOLDER
from tools.hub_check import main as hub_check

HUB_FOLDER = str(FOLDER)  # hub/retrieval-draft in this checkout


@pytest.fixture(scope="module", autouse=True)
def own_module_cache(tmp_path_factory):
    """Point transformers' dynamic-module cache at a temporary folder (and undo its ``sys.path`` entry)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path_factory.mktemp("hf_modules")))
        patch.setattr(sys, "path", list(sys.path))
        yield


class RecordingStreamer:
    """An HF streamer (``put``/``end``) that keeps every call: ("put", ids as a list) or ("end",)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def put(self, value: torch.Tensor) -> None:
        self.calls.append(("put", value.reshape(-1).tolist()))

    def end(self) -> None:
        self.calls.append(("end",))

    def streamed(self) -> tuple[list[int], list[int], int]:
        """(first put's ids, later puts' ids joined, number of ``end`` calls); asserts ``end`` came last."""
        assert self.calls and self.calls[-1] == ("end",)
        puts = [ids for kind, *rest in self.calls if kind == "put" for ids in rest]
        return puts[0], [token for ids in puts[1:] for token in ids], self.calls.count(("end",))


class RecordingOracle(OracleDrafter):
    """The oracle drafter, recording the length of every context it is asked to extend."""

    name = "recording_oracle"

    def __init__(self, reference) -> None:
        super().__init__(reference)
        self.asked: list[int] = []

    def propose(self, context, max_len):
        self.asked.append(int(context.shape[0]))
        return super().propose(context, max_len)


def hub_generate(model, prompt: torch.Tensor, max_new_tokens: int, **kwargs):
    """``model.generate`` through the folder, on fixed-size trees and without learning across calls."""
    kwargs.setdefault("adaptive_tree", False)
    kwargs.setdefault("draft_learning", False)
    return model.generate(
        prompt, max_new_tokens=max_new_tokens, custom_generate=HUB_FOLDER, trust_remote_code=True, **kwargs
    )


def test_the_folder_is_identical_to_plain_greedy_generate(tiny_llama):
    for seed, repeat in ((0, 1), (1, 3)):
        prompt = random_prompt(seed, length=12, repeat=repeat)
        expected = tiny_llama.generate(prompt, max_new_tokens=24, do_sample=False)
        assert torch.equal(hub_generate(tiny_llama, prompt, 24), expected)


def test_hfs_streamer_receives_the_prompt_then_every_new_token_once_in_order_then_end(tiny_llama):
    prompt = random_prompt(2, length=12, repeat=2)
    plain = RecordingStreamer()
    expected = tiny_llama.generate(prompt, max_new_tokens=20, do_sample=False, streamer=plain)
    ours = RecordingStreamer()
    got = hub_generate(tiny_llama, prompt, 20, streamer=ours)
    assert torch.equal(got, expected)
    first, new, ends = ours.streamed()
    assert first == prompt[0].tolist() and new == got[0, prompt.shape[1] :].tolist() and ends == 1
    assert (first, new, ends) == plain.streamed()  # what plain greedy streams, token for token


def test_a_text_streamer_prints_exactly_the_decoded_new_tokens(tiny_llama, capsys):
    tokenizer = word_tokenizer([], extra=TINY_VOCAB - 1)  # ids 0..319: "[UNK]", "w0", "w1", ...
    prompt = random_prompt(3, length=10, repeat=2)
    got = hub_generate(tiny_llama, prompt, 16, streamer=TextStreamer(tokenizer, skip_prompt=True))
    assert got.shape[1] > prompt.shape[1]
    assert capsys.readouterr().out == tokenizer.decode(got[0, prompt.shape[1] :]) + "\n"


def test_the_callable_route_streams_to_hfs_streamer_as_plain_greedy_generate_does(tiny_llama):
    """``streamer=`` beside ``custom_generate=retrieval_draft.generate``, as HF users pass it:
    transformers gives it the prompt and drops it for callables; ours gets it back."""
    prompt = random_prompt(2, length=12, repeat=2)
    plain = RecordingStreamer()
    expected = tiny_llama.generate(prompt, max_new_tokens=20, do_sample=False, streamer=plain)
    ours = RecordingStreamer()
    got = tiny_llama.generate(prompt, max_new_tokens=20, custom_generate=retrieval_draft.generate, streamer=ours,
                              adaptive_tree=False, draft_learning=False)
    assert torch.equal(got, expected)
    first, new, ends = ours.streamed()
    assert first == prompt[0].tolist() and new == got[0, prompt.shape[1] :].tolist() and ends == 1
    assert (first, new, ends) == plain.streamed()


def test_the_callable_route_prints_with_a_text_streamer_what_plain_greedy_generate_prints(tiny_llama, capsys):
    tokenizer = word_tokenizer([], extra=TINY_VOCAB - 1)  # ids 0..319: "[UNK]", "w0", "w1", ...
    prompt = random_prompt(3, length=10, repeat=2)
    for skip_prompt in (True, False):
        tiny_llama.generate(prompt, max_new_tokens=16, do_sample=False,
                            streamer=TextStreamer(tokenizer, skip_prompt=skip_prompt))
        plain = capsys.readouterr().out
        tiny_llama.generate(prompt, max_new_tokens=16, custom_generate=retrieval_draft.generate,
                            streamer=TextStreamer(tokenizer, skip_prompt=skip_prompt), draft_learning=False)
        assert capsys.readouterr().out == plain and plain.strip()


def test_the_callable_route_refuses_two_streamers_and_hfs_streamer_for_a_batch(tiny_llama):
    prompt = random_prompt(5)
    with pytest.raises(InvalidInputError, match="one streamer"):
        tiny_llama.generate(prompt, max_new_tokens=4, custom_generate=retrieval_draft.generate,
                            streamer=RecordingStreamer(), draft_streamer=RecordingStreamer())
    batch = prompt.repeat(2, 1)
    with pytest.raises(InvalidInputError, match="streamer= takes one sequence; for 2 rows pass draft_streamer="):
        tiny_llama.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=4,
                            custom_generate=retrieval_draft.generate, streamer=RecordingStreamer())


def test_our_options_reach_the_engine(tiny_llama):
    prompt = random_prompt(4, length=12)
    expected = tiny_llama.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=[])
    drafter = RecordingOracle(expected[0].numpy())
    stats = retrieval_draft.DecodeStats()
    got = hub_generate(
        tiny_llama, prompt, 24, eos_token_id=[], drafters=[drafter], draft_stats=stats, tree_budget=4, max_draft_len=4
    )
    assert torch.equal(got, expected)
    assert drafter.asked[0] == prompt.shape[1] + 1  # our drafter, asked from the prefill's token on
    steps = [b - a for a, b in zip(drafter.asked, drafter.asked[1:])]
    assert steps and set(steps) == {5}  # 4 drafted tokens (tree_budget=4, max_draft_len=4) + 1 per step
    assert stats.new_tokens == 24 and stats.steps == len(drafter.asked)  # draft_stats was filled


def test_stop_strings_with_a_tokenizer_stop_where_hf_stops(tiny_llama):
    tokenizer = bpe_tokenizer([__doc__], vocab_size=TINY_VOCAB)  # byte-level: decodes any id in the vocabulary
    prompt = random_prompt(2, length=12)
    start = prompt.shape[1]
    full = tiny_llama.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=[])
    for offset in range(4, 28):  # the first stop string, two new tokens' text, at which HF stops mid-output
        stop = tokenizer.decode(full[0, start + offset : start + offset + 2])
        expected = tiny_llama.generate(
            prompt, max_new_tokens=30, do_sample=False, eos_token_id=[], stop_strings=[stop], tokenizer=tokenizer
        )
        if start + 1 < expected.shape[1] < full.shape[1]:
            break
    assert start + 1 < expected.shape[1] < full.shape[1]
    got = hub_generate(tiny_llama, prompt, 30, eos_token_id=[], stop_strings=[stop], tokenizer=tokenizer)
    assert torch.equal(got, expected)


def test_streamer_and_draft_streamer_together_are_refused(tiny_llama):
    with pytest.raises(InvalidInputError, match="one streamer"):
        hub_generate(tiny_llama, random_prompt(5), 4, streamer=RecordingStreamer(), draft_streamer=RecordingStreamer())


def test_an_unimportable_package_fails_in_one_line_naming_pip_install(tiny_llama, monkeypatch):
    for name in [n for n in sys.modules if n.startswith("transformers_modules.") and "retrieval_hyphen_draft" in n]:
        monkeypatch.delitem(sys.modules, name)  # so transformers executes generate.py afresh
    for name in ("retrieval_draft", "retrieval_draft.serving", "retrieval_draft.serving.hub_route"):
        monkeypatch.setitem(sys.modules, name, None)  # importing the package or its modules now fails
    with pytest.raises(ImportError) as caught:
        hub_generate(tiny_llama, random_prompt(7), 4)
    message = str(caught.value)
    assert "\n" not in message and "pip install retrieval-draft" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_an_uninstalled_package_stops_at_transformers_requirements_check(tiny_llama, monkeypatch):
    installed = importlib.metadata.version

    def version(name: str) -> str:
        if name == "retrieval-draft":
            raise importlib.metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(ImportError, match=r"retrieval-draft>=0\.1\.0 \(installed: None\)"):
        hub_generate(tiny_llama, random_prompt(8), 4)


def test_hub_check_passes_on_the_folder(capsys):
    assert hub_check(["--max-new-tokens", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [
        [name, "ok"] for name in ("requirements", "load", "greedy", "streamer", "options")
    ]


def test_hub_check_fails_a_folder_that_drops_the_streamer(tmp_path, capsys):
    folder = tmp_path / "dropping-streamer"
    shutil.copytree(HUB_FOLDER, folder)
    code = folder / "custom_generate" / "generate.py"
    code.write_text(
        "from retrieval_draft.serving.hub_route import generate as ours\n\n\n"
        "def generate(*args, streamer=None, **kwargs):  # loses the streamer\n"
        "    return ours(*args, **kwargs)\n"
    )
    assert hub_check(["--folder", str(folder), "--max-new-tokens", "8"]) == 1
    failed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if " FAILED " in line]
    assert failed == ["load", "streamer"]  # its generate is its own, not the package's, and loses the streamer
