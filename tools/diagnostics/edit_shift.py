"""Would reusing the KV rows that follow an edit, shifted to their new positions, pay and be exact enough?

    python -m tools.diagnostics.edit_shift [--new-tokens 48] [--json PATH]

After an edit near the top of a file the shared prefix ends at the edit, but the chunk below it is
unchanged, only moved. llama.cpp's ``--cache-reuse`` keeps such chunks, re-rotating their keys to
the new positions. Those rows are not what a prefill of the edited file computes: every one of them
attended to the text before the edit. This measures what that costs, on the editor session's edit
(``tools.bench.session_workloads``: the request before the import edit and the one after it):

- the exact path: HF's greedy ``generate`` of the edited prompt (a one-shot prefill);
- the shifted path: the old prompt's rows, the prefix up to the edit kept as they are, the edit's
  tokens run on top, the unchanged chunk after the edit (the longest run of matching tokens,
  ``difflib``) moved by re-rotating its keys (RoPE: rotating by the shift composes with the rotation
  already applied), the rest of the prompt run, then greedy decoding from that cache.

Reports the tokens the shift would spare the prefill, the first token's logits against the exact
path's (largest difference, and the exact path's gap between its two best tokens), and how many of
the new tokens agree before the outputs part. Llama-style RoPE (``rotate_half``) models only.
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

import torch
from transformers import DynamicCache

from retrieval_draft.atomic import atomic_write_bytes


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def shift_keys(model, keys: torch.Tensor, shift: int) -> torch.Tensor:
    """Keys (B, H, n, d) rotated by RoPE as if ``shift`` positions later (the model's own rotary table)."""
    probe = keys.new_zeros((1, 1, keys.shape[-1]))
    cos, sin = model.model.rotary_emb(probe, torch.tensor([[shift]], device=keys.device))
    return keys * cos[:, None] + rotate_half(keys) * sin[:, None]


def moved_chunk(old: list[int], new: list[int], prefix: int) -> tuple[int, int, int]:
    """(old start, new start, length) of the longest run of ``old`` after ``prefix`` found again in ``new``."""
    matcher = difflib.SequenceMatcher(None, old[prefix:], new[prefix:], autojunk=False)
    block = max(matcher.get_matching_blocks(), key=lambda b: b.size)
    return prefix + block.a, prefix + block.b, block.size


@torch.no_grad()
def shifted_cache(model, old: list[int], new: list[int]) -> tuple[DynamicCache, dict]:
    """A cache of ``new[:-1]`` built from ``old``'s rows: shared prefix kept, the moved chunk re-rotated,
    everything else run; and what was spared."""
    prefix = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    old_start, new_start, size = moved_chunk(old, new, prefix)
    size = min(size, len(new) - 1 - new_start)  # the prompt's last token is always run
    rows = DynamicCache()
    model(torch.tensor([old]), past_key_values=rows, use_cache=True)
    cache = DynamicCache()
    for index, layer in enumerate(rows.layers):
        cache.update(layer.keys[:, :, :prefix], layer.values[:, :, :prefix], index)
    model(torch.tensor([new[prefix:new_start]]), past_key_values=cache, use_cache=True)
    for index, layer in enumerate(rows.layers):
        keys = shift_keys(model, layer.keys[:, :, old_start : old_start + size], new_start - old_start)
        cache.update(keys, layer.values[:, :, old_start : old_start + size], index)
    return cache, {"prefix": prefix, "edit_tokens": new_start - prefix, "moved": size, "shift": new_start - old_start,
                   "prompt_tokens": len(new)}


def compare(model, old: list[int], new: list[int], new_tokens: int) -> dict:
    """The shifted path against the exact one on prompt ``new`` (see the module docstring)."""
    prompt = torch.tensor([new])
    exact = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False,
                           return_dict_in_generate=True, output_logits=True)
    cache, spared = shifted_cache(model, old, new)
    shifted = model.generate(prompt, attention_mask=torch.ones_like(prompt), past_key_values=cache,
                             max_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True, output_logits=True)
    a, b = exact.sequences[0, len(new):].tolist(), shifted.sequences[0, len(new):].tolist()
    agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    first, other = exact.logits[0][0].float(), shifted.logits[0][0].float()
    top = first.topk(2).values
    return {**spared, "first_logit_max_diff": round(float((first - other).abs().max()), 4),
            "exact_top2_gap": round(float(top[0] - top[1]), 4), "same_first_token": a[:1] == b[:1],
            "tokens_agreeing": agree, "new_tokens": len(a), "identical": a == b}


def main(argv: list[str] | None = None) -> dict:
    from retrieval_draft.model.models import load_model_and_tokenizer
    from tools.bench.session_workloads import EDIT_AFTER, editor_requests

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    model, tokenizer = load_model_and_tokenizer()
    requests = editor_requests(tokenizer)
    result = compare(model, list(requests[EDIT_AFTER - 1].ids), list(requests[EDIT_AFTER].ids), args.new_tokens)
    print(json.dumps(result, indent=1))
    if args.json:
        atomic_write_bytes(args.json, (json.dumps(result, indent=1) + "\n").encode())
    return result


if __name__ == "__main__":
    main()
