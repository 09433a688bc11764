"""Fill-in-the-middle prompts: the text a code model was trained to read for "fill the gap between
this and that", laid out as llama.cpp's ``/infill`` lays it out.

A model trained for FIM has special tokens that mark the parts; its tokenizer carries them as added
tokens, which is how ``fim_template`` finds them (none found: ``NoFillInMiddleError``):

- Qwen2.5-Coder: ``<|fim_prefix|>BEFORE<|fim_suffix|>AFTER<|fim_middle|>``, and for context from other
  files ``<|repo_name|>`` and ``<|file_sep|>``;
- StarCoder, StarCoder2, SantaCoder: the same shape with ``<fim_prefix>``, ``<fim_suffix>``,
  ``<fim_middle>`` (StarCoder2 adds ``<repo_name>`` and ``<file_sep>``).

``fim_prompt`` makes the prompt text (prefix-suffix-middle order; the model writes the middle):

    [chunks of other files, when there are any]<fim_prefix>BEFORE + TYPED<fim_suffix>AFTER<fim_middle>

Chunks from other files come first, in the repository-level layout llama.cpp uses (Qwen2.5-Coder's
report, arXiv 2409.12186): ``<repo_name>myproject\\n``, then ``<file_sep>FILENAME\\n TEXT`` per chunk,
then ``<file_sep>filename\\n`` standing for the file being edited (llama.cpp's own placeholder names);
a model without those tokens gets each chunk after ``"\\n\\n--- snippet ---\\n\\n"``, as llama.cpp does.
Unlike llama.cpp, a request with no chunks gets no repository header: its prompt is the plain FIM
prompt, the one a client sends itself to ``/v1/completions``. The text is tokenized whole by the
server (so text that spells a special token reads as that token), and nothing is cut to fit a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from retrieval_draft.errors import NoFillInMiddleError

SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"  # before each chunk when the model has no file separator
REPO_NAME, CURRENT_FILE = "myproject", "filename"  # llama.cpp's placeholders in the repository layout


@dataclass(frozen=True)
class FimTemplate:
    """A model's FIM tokens: the three that frame the parts, and the repository-level pair (None
    when the tokenizer lacks them)."""

    prefix: str
    suffix: str
    middle: str
    repo_name: str | None = None
    file_sep: str | None = None
    ends: tuple[str, ...] = ()  # tokens that close the middle (those the tokenizer has)


# Families in the order they are looked for; a tokenizer holding a family's three framing tokens uses it.
# Qwen2.5-Coder-0.5B-Instruct closes a middle with <|endoftext|>, which is not its eos (<|im_end|>).
TEMPLATES = (
    FimTemplate("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>",
                ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|im_end|>")),  # Qwen2.5-Coder
    FimTemplate("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>",
                ("<|endoftext|>", "<fim_pad>", "<file_sep>")),  # StarCoder family
)


@dataclass(frozen=True)
class ExtraChunk:
    """Text from another file that the editor sends as context (llama.cpp's ``input_extra`` item)."""

    filename: str
    text: str


def fim_template(tokenizer, model_name: str = "this model") -> FimTemplate:
    """The FIM template of ``tokenizer`` (an HF tokenizer), read from its added tokens;
    ``NoFillInMiddleError`` (one line, naming ``model_name``) when it has none of ``TEMPLATES``."""
    added = set(tokenizer.get_added_vocab())
    for template in TEMPLATES:
        if {template.prefix, template.suffix, template.middle} <= added:
            return FimTemplate(template.prefix, template.suffix, template.middle,
                               template.repo_name if template.repo_name in added else None,
                               template.file_sep if template.file_sep in added else None,
                               tuple(token for token in template.ends if token in added))
    known = "; ".join(f"{t.prefix}{t.suffix}{t.middle}" for t in TEMPLATES)
    raise NoFillInMiddleError(f"{model_name} has no fill-in-the-middle tokens (looked for {known}): "
                              f"infill needs a code model trained for it, such as qwen2.5-coder-0.5b")


def end_token_ids(tokenizer, template: FimTemplate) -> list[int]:
    """Ids of the tokens that close a middle (``template.ends``), for ``generate``'s ``eos_token_id``
    beside the model's own: a model trained for FIM ends the middle with one of them, which need not be
    its chat eos (and a plain ``generate`` would then write on past the gap)."""
    return [int(tokenizer.convert_tokens_to_ids(token)) for token in template.ends]


def fim_prompt(template: FimTemplate, before: str, after: str, extra: tuple[ExtraChunk, ...] = (),
               typed: str = "") -> str:
    """The prompt text that asks for the middle between ``before`` + ``typed`` (text above the cursor
    and what was typed at it) and ``after``, with ``extra`` chunks first (module docstring)."""
    return _extra_text(template, extra) + f"{template.prefix}{before}{typed}{template.suffix}{after}{template.middle}"


def _extra_text(template: FimTemplate, extra: tuple[ExtraChunk, ...]) -> str:
    """The chunks of other files as the prompt's head; empty when there are none."""
    if not extra:
        return ""
    head = f"{template.repo_name}{REPO_NAME}\n" if template.repo_name else ""
    for chunk in extra:
        head += f"{template.file_sep}{chunk.filename}\n" if template.file_sep else SNIPPET_SEPARATOR
        head += chunk.text
    return head + (f"{template.file_sep}{CURRENT_FILE}\n" if template.file_sep else "")
