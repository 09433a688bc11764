"""A model folder that ``transformers serve`` loads with our decoding.

``lay_out`` makes, under ``<cache>/served/<key>/<name>/`` (``key`` names the model's files and
the options, so each set has its own folder), a model folder of links to the model's own files
(config, weights, tokenizer) plus, unless ``plain``, our ``custom_generate/`` (copied from this
package) and the options file (``options.OPTIONS_FILE``). A GGUF model (the default SmolLM2-135M,
``gemma3-270m``, ``qwen2.5-coder-0.5b``, a ``.gguf`` path) is first converted once into the cache
(``converted_gguf``), since transformers cannot save a model it read from GGUF; the folder links
those converted files.

The folder is built in a temp folder beside its final name and swapped into place
(``atomic.swap_into_place``), so a server never loads a half-written one. ``plain`` lays out
the same model without our decoding: the server a comparison runs against.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from retrieval_draft.atomic import atomic_write_bytes, fsync_path, swap_into_place, temp_dir_next_to
from retrieval_draft.cache_dir import cache_root
from retrieval_draft.errors import ModelLoadError
from retrieval_draft.model.converted_gguf import converted_part
from retrieval_draft.model.models import MODEL_NAMES, model_location
from retrieval_draft.serving.options import OPTIONS_FILE, ServeOptions

CUSTOM_GENERATE = Path(__file__).resolve().parent / "custom_generate"
OURS = ("custom_generate", OPTIONS_FILE)  # what a laid-out folder adds to the model's files


def model_files(model: str | None) -> list[Path]:
    """The folders whose files make up ``model`` (a local HF folder, a ``.gguf`` file, a name of
    ``models.MODEL_NAMES``, or None for the default): the folder itself, or a GGUF file's converted
    model and tokenizer (converting it first, once per machine). ``ModelLoadError`` otherwise."""
    folder, extra = model_location(model)
    if "gguf_file" not in extra:
        return [Path(folder).resolve()]
    gguf = os.path.join(folder, extra["gguf_file"])
    parts = [converted_part(gguf, part) for part in ("model", "tokenizer")]
    if None in parts:
        from retrieval_draft.model.models import load_model_and_tokenizer

        load_model_and_tokenizer(model)  # converts the file and keeps both parts in the cache
        parts = [converted_part(gguf, part) for part in ("model", "tokenizer")]
    if None in parts:
        raise ModelLoadError(f"cannot serve {gguf}: its converted copy could not be written under {cache_root()}")
    return parts


def served_name(model: str | None) -> str:
    """The name clients ask for: the model's name (``smollm2-135m``), or its file's or folder's name."""
    if model is None or model in MODEL_NAMES:
        return model or MODEL_NAMES[0]
    path = Path(model).resolve()
    return path.stem if path.suffix == ".gguf" else path.name


def _name_architecture(config: Path) -> None:
    """Give ``config`` (a link to a model's ``config.json``) the ``architectures`` entry that
    ``transformers serve`` picks the model class by, as a file of its own, when it lacks one (a model
    converted from GGUF has none): the causal-LM class transformers maps its ``model_type`` to."""
    if not config.is_file():
        return
    body = json.loads(config.read_text(encoding="utf-8"))
    if body.get("architectures"):
        return
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(body.get("model_type"))
    if architecture is None:
        raise ModelLoadError(f"cannot serve a model of type {body.get('model_type')!r}: transformers has no causal LM for it")
    config.unlink()
    atomic_write_bytes(config, json.dumps({**body, "architectures": [architecture]}, indent=2).encode("utf-8"))


def lay_out(model: str | None, options: ServeOptions | None, root: Path | None = None) -> Path:
    """The served folder of ``model`` with ``options`` (None: ``plain``, no decoding of ours), laid
    out afresh under ``root`` (default ``<cache>/served``); returns its path, whose last part is
    ``served_name(model)``."""
    sources = model_files(model)
    record = {"sources": [str(source) for source in sources], "plain": options is None,
              "options": None if options is None else json.loads(options.to_json())}
    key = hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()[:16]
    target = (root or cache_root() / "served") / key / served_name(model)
    staging = temp_dir_next_to(target)
    try:
        for source in sources:
            for file in sorted(source.iterdir()):
                if file.is_file() and file.name not in OURS and not (staging / file.name).exists():
                    (staging / file.name).symlink_to(file.resolve())
        _name_architecture(staging / "config.json")
        if options is not None:
            shutil.copytree(CUSTOM_GENERATE, staging / "custom_generate",
                            ignore=shutil.ignore_patterns("__pycache__"))
            atomic_write_bytes(staging / OPTIONS_FILE, options.to_json().encode("utf-8"))
        fsync_path(staging)
        swap_into_place(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
