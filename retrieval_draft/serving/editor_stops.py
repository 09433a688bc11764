"""llama.cpp's two editor stops for ``/infill``: ``n_indent`` and ``t_max_predict_ms``.

An editor asks for the middle at a cursor and wants only what belongs to the block it is in, soon.
llama.cpp's server (``tools/server/server-context.cpp``) gives it two rules, which llama.vim sends:

- ``n_indent`` (characters, > 0): after the first line of the middle (the rest of the cursor's line),
  a line that starts with fewer than ``n_indent`` spaces or tabs ends the middle: the generation
  stops as soon as the line's first other character appears (a blank line's newline counts), and
  the answer keeps the text up to that character (the line's own indentation included, its text
  not). ``short_line_at`` finds where.
- ``t_max_predict_ms`` (milliseconds, > 0): once that long has passed since the first new token,
  the generation stops at the next token whose text holds a newline (that token kept), so a slow
  middle still ends on a whole line.

``EditorStops`` applies both as one stopping criterion over the decoded middle (``request_stops``
hands it to the request's ``generate``, ours or plain HF's). llama.cpp checks the indentation of a
line only from the token after the one that ended the line before it; here every token is checked,
which finds the same cut.
"""

from __future__ import annotations

import time

import torch
from transformers.generation.stopping_criteria import StoppingCriteria

INDENT = " \t"  # the characters llama.cpp counts as indentation


def short_line_at(text: str, n_indent: int) -> int | None:
    """Where ``n_indent`` ends ``text`` (a middle being written): the index of the first character
    after the indentation of the first line, after ``text``'s first line, indented by fewer than
    ``n_indent`` characters of ``INDENT``; None when no such line has begun (or ``n_indent`` <= 0)."""
    if n_indent <= 0:
        return None
    start = text.find("\n") + 1
    while start > 0:
        position = start
        while position < len(text) and text[position] in INDENT:
            position += 1
        if position == len(text):
            return None  # the line's first character is still to come
        if position - start < n_indent:
            return position
        start = text.find("\n", start) + 1
    return None


class EditorStops(StoppingCriteria):
    """Stops one row's generation by ``n_indent`` and ``t_max_predict_ms`` (module docstring).

    Args:
        tokenizer: decodes the new tokens (special tokens skipped, as the server's answer does).
        n_indent: least indentation of a line after the first, in characters (0: no rule).
        t_max_predict_ms: milliseconds after the first new token from which a newline ends the middle
            (None: no rule).

    ``fired`` is then ``"indent"`` or ``"time"``: the rule that stopped it (None until one did).
    """

    def __init__(self, tokenizer, n_indent: int = 0, t_max_predict_ms: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.n_indent = n_indent
        self.t_max_predict_ms = t_max_predict_ms
        self.fired: str | None = None
        self._prompt_tokens: int | None = None
        self._first_token_at = 0.0
        self._text = ""

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        """``input_ids``: (1, L), the prompt and the new tokens so far; returns (1,) bool."""
        if self._prompt_tokens is None:  # the first call: one new token
            self._prompt_tokens = input_ids.shape[-1] - 1
            self._first_token_at = time.perf_counter()
        text = self.tokenizer.decode(input_ids[0, self._prompt_tokens:], skip_special_tokens=True)
        added, self._text = text[len(self._text):], text
        if self.fired is None and short_line_at(text, self.n_indent) is not None:
            self.fired = "indent"
        elapsed_ms = (time.perf_counter() - self._first_token_at) * 1000
        if self.fired is None and self.t_max_predict_ms is not None and "\n" in added and elapsed_ms > self.t_max_predict_ms:
            self.fired = "time"
        return torch.full((input_ids.shape[0],), self.fired is not None, dtype=torch.bool, device=input_ids.device)
