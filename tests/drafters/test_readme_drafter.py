"""The docs' example drafter (docs/how-it-works.md) works as the page says: identical output, accepted drafts."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import retrieval_draft
from tests.conftest import make_tiny_llama, random_prompt

README = Path(__file__).resolve().parents[2] / "docs" / "how-it-works.md"  # the page that teaches adding a drafter


def _readme_drafter_class():
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Add a drafter"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace["SnippetDrafter"]


def test_the_readme_snippet_drafter_keeps_output_identical_and_gets_accepted():
    SnippetDrafter = _readme_drafter_class()
    model = make_tiny_llama(seed=81)
    prompt = random_prompt(81, length=12)
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False)
    snippet = expected[0, 8:].tolist()  # the model's own continuation, from inside the prompt on
    stats = retrieval_draft.DecodeStats()
    got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False,
                         custom_generate=retrieval_draft.generate, drafters=[SnippetDrafter([snippet])],
                         draft_stats=stats, draft_learning=False, adaptive_tree=False)
    assert torch.equal(got, expected)
    assert stats.mean_accepted > 4.0
