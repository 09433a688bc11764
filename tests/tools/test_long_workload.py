"""The benchmark's ``long`` workload: whole standard-library modules to edit and print again."""

import importlib
import inspect

from retrieval_draft.model.models import load_tokenizer
from tools.bench.workloads import LONG_MODULES, build_workloads


def test_long_prompts_hold_whole_modules_in_a_fixed_order():
    prompts = build_workloads(["long"], 3, seed=0)["long"]
    assert [p.prompt_id for p in prompts] == [f"{m}.py" for m in LONG_MODULES[:3]]
    for prompt, module in zip(prompts, LONG_MODULES):
        assert inspect.getsource(importlib.import_module(module)) in prompt.text and prompt.chat


def test_long_prompts_are_4k_to_8k_tokens_and_leave_room_for_the_answer():
    tokenizer = load_tokenizer()  # SmolLM2's: the default model, 8,192 positions
    for prompt in build_workloads(["long"], len(LONG_MODULES), seed=0)["long"]:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True, return_dict=False)
        assert 4000 <= len(ids) <= 8192 - 512, prompt.prompt_id


def test_long_raw_prompts_are_the_same_modules_as_raw_continuations_of_4k_to_8k_tokens():
    tokenizer = load_tokenizer()
    chat = build_workloads(["long"], len(LONG_MODULES), seed=0)["long"]
    raw = build_workloads(["long_raw"], len(LONG_MODULES), seed=0)["long_raw"]
    assert [p.prompt_id for p in raw] == [p.prompt_id for p in chat]
    for prompt, module in zip(raw, LONG_MODULES):
        source = inspect.getsource(importlib.import_module(module))
        assert not prompt.chat and source in prompt.text
        assert prompt.text.rstrip().endswith("with type hints added to every function signature:")
        assert 4000 <= len(tokenizer(prompt.text)["input_ids"]) <= 8192 - 512, prompt.prompt_id
