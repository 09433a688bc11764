"""The preamble under which the tagged blocks of README.md and docs/*.md run in the suite
(``tests/tools/test_doc_blocks.py``). A block runs as written, except for these three things:

1. **The default model is a tiny one.** A random 2-layer Llama (width 64, 1,024 positions) saved
   beside a small byte-level BPE tokenizer (400 ids, trained on five stdlib modules, with a
   one-line chat template) stands in for SmolLM2-135M: whatever loads the default model without
   naming one (``load_model_and_tokenizer()``, ``retrieval-draft`` without ``--model``) loads it
   (``models.default_model_path`` answers its folder).
2. **Paths a test machine lacks are rewritten**, whole shell words only (``REWRITES``): the standard
   library (``/usr/lib/python3.11``, or the ``$(python -c ...)`` that prints it) becomes the five
   modules; ``~/src/app`` a copy of them; ``M`` and ``tok-dir`` (the model and tokenizer a reader
   names) the tiny model's folder.
3. **What a block assumes exists, exists** in its working folder: ``my-store`` (a store of the five
   modules in the tiny tokenizer's ids), ``stub.py`` (a prompt file), ``path/to/hub/retrieval-draft``
   (a link to this repository's Hub folder); and a Python block starts with ``model``,
   ``tokenizer`` and ``inputs`` made as the README's first lines make them. The user cache is a
   folder of the page's own (``$RETRIEVAL_DRAFT_CACHE``), so ``retrieval-draft cache --reset`` resets that.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.datastore_fixtures import STDLIB_FILES, bpe_tokenizer, stdlib_corpus

REPO = Path(__file__).resolve().parents[1]
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
STDLIB_WORDS = ("/usr/lib/python3.11",
                "$(python -c 'import sysconfig;print(sysconfig.get_paths()[\"stdlib\"])')",
                "$(python -c 'import sysconfig;print(sysconfig.get_paths()[\"purelib\"])')")
PROMPT = "def fibonacci(n):\n"


@dataclass(frozen=True)
class Scene:
    """The folders one page's blocks run with: ``cwd`` the working folder (empty but for what the
    blocks assume), ``model`` the tiny default model, ``corpus`` the five modules, ``app`` a copy."""

    cwd: Path
    model: Path
    corpus: Path
    app: Path

    @property
    def rewrites(self) -> dict[str, str]:
        """Shell word -> what it becomes here (point 2 above)."""
        words = {word: str(self.corpus) for word in STDLIB_WORDS}
        words.update({"~/src/app": str(self.app), "M": str(self.model), "tok-dir": str(self.model)})
        return words


# Qwen2.5-Coder's fill-in-the-middle tokens, for a tiny stand-in of a code model (``tiny_model_folder``).
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
              "<|endoftext|>")


def tiny_model_folder(folder: Path, name: str = "tiny-model", special_tokens: tuple[str, ...] = ()) -> Path:
    """Save the tiny stand-in model and its tokenizer (with a chat template) into ``folder/name``;
    ``special_tokens`` are added to the tokenizer as special tokens (``FIM_TOKENS``: a code model's)."""
    texts = [path.read_text(encoding="utf-8") for path in sorted(stdlib_corpus(folder / "texts").glob("*.py"))]
    tokenizer = bpe_tokenizer(texts, vocab_size=400)
    tokenizer.add_tokens(list(special_tokens), special_tokens=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    target = folder / name
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    shutil.rmtree(folder / "texts")
    return target


def make_scene(root: Path, model_folder: Path) -> Scene:
    """A fresh scene under ``root`` for one page, with the tiny model at ``model_folder``."""
    from retrieval_draft.model.models import load_tokenizer
    from retrieval_draft_datastore.builder import build

    corpus = stdlib_corpus(root / "stdlib")
    app = stdlib_corpus(root / "src" / "app")
    cwd = root / "work"
    cwd.mkdir()
    build([str(corpus / name) for name in STDLIB_FILES], cwd / "my-store", load_tokenizer(str(model_folder)),
          progress=False)
    (cwd / "stub.py").write_text(PROMPT, encoding="utf-8")
    (cwd / "path" / "to" / "hub").mkdir(parents=True)
    os.symlink(REPO / "hub" / "retrieval-draft", cwd / "path" / "to" / "hub" / "retrieval-draft")
    return Scene(cwd=cwd, model=model_folder, corpus=corpus, app=app)


def python_names() -> dict:
    """``model``, ``tokenizer`` and ``inputs`` as the README's first lines make them."""
    from retrieval_draft.model.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer()
    return {"model": model, "tokenizer": tokenizer, "inputs": tokenizer(PROMPT, return_tensors="pt")}
