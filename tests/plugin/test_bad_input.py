"""Bad input gets a clear, typed error; the CLI prints one line and exits non-zero."""

import subprocess
import sys

import pytest
import torch

import retrieval_draft
from retrieval_draft.errors import InvalidInputError, ModelLoadError
from retrieval_draft.model.attention_layout import CHAIN, attention_layout
from retrieval_draft.model.models import load_model
from tests.conftest import make_tiny_llama, random_prompt


def plugin(model, prompt, **kwargs):
    return model.generate(prompt, custom_generate=retrieval_draft.generate, **kwargs)


def test_empty_prompt_is_rejected(tiny_llama):
    with pytest.raises(InvalidInputError, match="empty"):
        plugin(tiny_llama, torch.zeros((1, 0), dtype=torch.long), max_new_tokens=4)


def test_a_batch_row_of_padding_only_is_rejected(tiny_llama):
    ids = torch.cat([random_prompt(1), random_prompt(2)])
    mask = torch.ones_like(ids)
    mask[1] = 0
    with pytest.raises(InvalidInputError, match="row of the batch is empty"):
        plugin(tiny_llama, ids, attention_mask=mask, max_new_tokens=4)


def test_zero_new_tokens_is_rejected(tiny_llama):
    with pytest.raises((InvalidInputError, ValueError)):
        plugin(tiny_llama, random_prompt(3), max_new_tokens=0)


def test_prompt_longer_than_the_context_is_rejected(tiny_llama):
    huge = random_prompt(4, length=300)  # the tiny model holds 256 positions
    with pytest.raises(InvalidInputError, match="context holds 256"):
        plugin(tiny_llama, huge, max_new_tokens=4)


def test_token_ids_out_of_range_are_rejected(tiny_llama):
    prompt = random_prompt(5)
    prompt[0, 3] = 10_000
    with pytest.raises(InvalidInputError, match="token ids"):
        plugin(tiny_llama, prompt, max_new_tokens=4)


def test_a_flash_attention_model_verifies_chains_and_says_why():
    model = make_tiny_llama()
    model.config._attn_implementation = "flash_attention_2"
    layout = attention_layout(model)  # no forward: flash attention cannot run on this CPU at all
    assert layout.mode == CHAIN
    assert "'flash_attention_2' takes no 4D mask" in layout.chain_reason


def test_unknown_model_path_is_a_typed_error(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nope"))


def test_cli_unknown_model_prints_one_line_and_exits_nonzero(tmp_path):
    """A new process running the program as ``python -m`` does: one line, exit code 2, and the
    program started without torch and refused the model before torch or transformers loaded."""
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['retrieval-draft', 'generate', '--model', {str(tmp_path / 'missing')!r}, '--prompt', 'hi']\n"
        "try:\n"
        "    runpy.run_module('retrieval_draft_datastore.cli', run_name='__main__')\n"
        "except SystemExit:\n"
        "    print('torch' in sys.modules, 'transformers' in sys.modules)\n"
        "    raise\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: model path not found: {tmp_path / 'missing'} (give a local folder, a .gguf file or one of the "
        "names smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b)"
    ]
    assert result.stdout.split() == ["False", "False"]


def test_cli_empty_prompt_prints_one_line_and_exits_nonzero(capsys):
    """The command line's own ``main`` in this process (the check above runs a new process)."""
    from retrieval_draft_datastore.cli import main

    capsys.readouterr()
    assert main(["generate", "--prompt", "   "]) == 2
    assert capsys.readouterr().err.strip() == "error: the prompt is empty"
