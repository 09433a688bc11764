"""The plugin's drafting settings and their defaults: the one owner of each, and of its check.

The plugin's keyword arguments, the CLI's flags, ``sessions.session.GenerationRequest``
and the tools all take their defaults from ``DEFAULTS``; every entry point checks
a setting with ``check_setting`` (``DraftConfig`` does, on construction), so each
setting's type and range are written down once, here. Imports nothing heavy: the
command line reads this module without torch.
"""

from __future__ import annotations

import numbers
from types import MappingProxyType
from dataclasses import dataclass, fields

from retrieval_draft.errors import InvalidInputError

MAX_TREE_BUDGET = 4096  # draft nodes per tree; a tree's mask holds (nodes + 1) x (context + nodes + 1) entries
MAX_DRAFT_LEN = 4096  # tokens per draft path
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
MAX_PREFIX_CACHE_BYTES = 2**50  # a bound for nonsense only (1 PiB); memory runs out long before


def one_line(value, limit: int = 60) -> str:
    """``value`` for a one-line error: its repr with whitespace runs as one space, at most ``limit``
    characters (a tokenizer's or a tensor's repr spans many lines)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _integer(name: str, value, low: int, high: int, shown: str = "") -> int:
    """``value`` as an int in ``low..high`` (a Python or numpy integer; never a bool or a float);
    ``shown`` names the range in the error (default ``low..high``)."""
    wanted = f"{name} must be {shown or f'an integer in {low}..{high}'}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidInputError(f"{wanted}, got {one_line(value)} ({type(value).__name__})")
    if not low <= int(value) <= high:
        raise InvalidInputError(f"{wanted}, got {one_line(value)}")
    return int(value)


def _flag(name: str, value) -> bool:
    """``value`` as a bool (True / False, or a numpy bool); 'no', 0 and None are refused, not guessed."""
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    if not (isinstance(value, bool) or numpy_bool):
        raise InvalidInputError(f"{name} must be True or False, got {one_line(value)} ({type(value).__name__})")
    return bool(value)


def _seed(name: str, value) -> int | None:
    return None if value is None else _integer(name, value, *SEED_RANGE, shown="None or an integer in -2**63..2**64-1")


# setting -> its check, which returns the value normalised (numpy scalars to Python ones); read-only
_CHECKS = MappingProxyType({
    "tree_budget": lambda name, value: _integer(name, value, 0, MAX_TREE_BUDGET),
    "max_draft_len": lambda name, value: _integer(name, value, 1, MAX_DRAFT_LEN),
    "adaptive_tree": _flag,
    "draft_learning": _flag,
    "draft_seed": _seed,
    "prefix_cache_bytes": lambda name, value: _integer(name, value, 0, MAX_PREFIX_CACHE_BYTES,
                                                       shown="an integer number of bytes >= 0 (0 turns reuse off)"),
})


def check_setting(name: str, value):
    """``value`` for the setting ``name``, checked and normalised; ``InvalidInputError`` naming
    the setting, its valid range and the value given otherwise."""
    return _CHECKS[name](name, value)


@dataclass(frozen=True)
class DraftConfig:
    """How drafts are made and verified (none of it changes what is generated).

    Attributes:
        tree_budget: most draft nodes per verification tree (0 = plain decoding), 0..4096.
        max_draft_len: deepest draft path, in tokens, 1..4096.
        adaptive_tree: size each tree by measured cost and observed acceptance;
            False verifies ``tree_budget`` nodes whenever drafts allow.
        draft_learning: start from what earlier calls with the model learned
            (acceptance rates, cost corrections) and draft from their outputs.
        draft_seed: seed of sampling (None: drawn from torch's global generator).
        prefix_cache_bytes: most bytes of KV rows kept per model for later calls to start from
            (``model.prefix_cache``; 512 MiB, ~11.6k tokens of SmolLM2-135M in float32); 0 turns
            reuse off (and empties the model's cache).
    """

    tree_budget: int = 32
    max_draft_len: int = 32
    adaptive_tree: bool = True
    draft_learning: bool = True
    draft_seed: int | None = None
    prefix_cache_bytes: int = 512 * 2**20

    def __post_init__(self) -> None:
        for field in fields(self):
            object.__setattr__(self, field.name, check_setting(field.name, getattr(self, field.name)))


DEFAULTS = DraftConfig()
