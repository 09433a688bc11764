"""llama.cpp's editor stops for ``/infill`` (``serving.editor_stops``): where ``n_indent`` ends a
middle, and when ``t_max_predict_ms`` does, token by token, with a stand-in tokenizer and clock."""

from __future__ import annotations

import pytest
import torch

from retrieval_draft.serving import editor_stops
from retrieval_draft.serving.editor_stops import EditorStops, short_line_at
from tests.stand_in_clocks import stepping_clock


@pytest.mark.parametrize("text, n_indent, at", [
    ("x = 1\nreturn", 4, 6),                  # the line after the first, not indented: cut before its text
    ("x = 1\n    y = 2\n  z", 4, 18),         # the indented line passes, the two-space one ends it
    ("x = 1\n\t\t\t\ty", 4, None),            # tabs count as indentation
    ("x = 1\n\ty", 2, 7),
    ("x = 1\n\n    y", 4, 6),                 # a blank line ends it (its newline is a character after no indent)
    ("x = 1\n  ", 4, None),                   # the line's first character has not come yet
    ("return", 4, None),                      # the first line (the cursor's) is never measured
    ("x\nreturn", 0, None),                   # 0: no rule
])
def test_a_middle_ends_at_the_first_line_indented_less_than_n_indent(text, n_indent, at):
    assert short_line_at(text, n_indent) == at


class CharTokenizer:
    """Each id is one piece of text (``PIECES``)."""

    PIECES = ["<p>", "x = 1", "\n", "    y", "\n", "z", " + 1"]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.PIECES[i] for i in ids.tolist())


def first_stop(stops: EditorStops, new: list[int], prompt: list[int] = (0,)) -> int | None:
    """How many of ``new`` the generation keeps: the criterion asked after each token, as generate asks."""
    for count in range(1, len(new) + 1):
        if bool(stops(torch.tensor([[*prompt, *new[:count]]]), None).all()):
            return count
    return None


def test_n_indent_stops_the_generation_at_the_token_that_begins_a_short_line():
    tokens = [1, 2, 3, 4, 5, 6]  # "x = 1", "\n", "    y", "\n", "z", " + 1"
    stops = EditorStops(CharTokenizer(), n_indent=4)
    assert first_stop(stops, tokens) == 5 and stops.fired == "indent"
    assert first_stop(EditorStops(CharTokenizer(), n_indent=2), tokens) == 5
    assert first_stop(EditorStops(CharTokenizer(), n_indent=5), tokens) == 3  # "    y" is too shallow too
    assert first_stop(EditorStops(CharTokenizer()), tokens) is None


def test_t_max_predict_ms_stops_at_the_first_newline_after_the_time_limit(monkeypatch):
    # each clock read is 250 ms after the one before; the first call reads twice (start, then now)
    monkeypatch.setattr(editor_stops, "time", stepping_clock(0.25))
    stops = EditorStops(CharTokenizer(), t_max_predict_ms=600)
    # the newline at the 2nd token comes 500 ms after the first token, the one at the 4th 1,000 ms after
    assert first_stop(stops, [1, 2, 3, 4, 5, 6]) == 4 and stops.fired == "time"
