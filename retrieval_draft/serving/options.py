"""What a served model folder tells our decoding: ``retrieval_draft.json`` beside the weights.

``retrieval-draft serve`` writes it; the folder's ``custom_generate/generate.py``
(``hub_route.generate``) reads it at every request and passes its options to
``retrieval_draft.generate`` as keyword arguments, under whatever the caller passed itself.
Every option is checked when the file is written (``ServeOptions``), so a server never starts
with an option that every request would refuse. Imports nothing heavy.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from retrieval_draft.config import DEFAULTS, check_setting
from retrieval_draft.drafters.registry import known_names
from retrieval_draft.errors import InvalidInputError

OPTIONS_FILE = "retrieval_draft.json"
OPTIONS_FORMAT = 1


@dataclass(frozen=True)
class ServeOptions:
    """The ``generate`` options every request of a served model gets (its own keywords win).

    Attributes:
        datastore: absolute paths of the stores to draft from (empty: none).
        drafters: registry names (empty: the default menu).
        tree_budget, max_draft_len, adaptive_tree, prefix_cache_bytes: as ``retrieval_draft.generate``
            takes them (``config.DEFAULTS``).
    """

    datastore: tuple[str, ...] = ()
    drafters: tuple[str, ...] = ()
    tree_budget: int = DEFAULTS.tree_budget
    max_draft_len: int = DEFAULTS.max_draft_len
    adaptive_tree: bool = DEFAULTS.adaptive_tree
    prefix_cache_bytes: int = DEFAULTS.prefix_cache_bytes

    def __post_init__(self) -> None:
        for name in ("tree_budget", "max_draft_len", "adaptive_tree", "prefix_cache_bytes"):
            object.__setattr__(self, name, check_setting(name, getattr(self, name)))
        object.__setattr__(self, "drafters", known_names(list(self.drafters)) if self.drafters else ())
        paths = tuple(str(Path(path).resolve()) for path in self.datastore)
        missing = [path for path in paths if not Path(path).is_dir()]
        if missing:
            raise InvalidInputError(f"no datastore at {missing[0]}: build one with `retrieval-draft build`")
        object.__setattr__(self, "datastore", paths)

    def generate_kwargs(self) -> dict:
        """The keyword arguments for ``retrieval_draft.generate``."""
        kwargs = {name: getattr(self, name) for name in ("tree_budget", "max_draft_len", "adaptive_tree",
                                                            "prefix_cache_bytes")}
        if self.datastore:
            kwargs["datastore"] = list(self.datastore)
        if self.drafters:
            kwargs["drafters"] = list(self.drafters)
        return kwargs

    def to_json(self) -> str:
        """The file's text: the format number and every option."""
        return json.dumps({"format": OPTIONS_FORMAT, "options": asdict(self)}, indent=2, sort_keys=True) + "\n"


def read_options(folder: str | Path) -> ServeOptions | None:
    """The options ``folder`` carries (``OPTIONS_FILE``), or None when it carries none (a Hub repo id,
    a folder no ``serve`` laid out). ``InvalidInputError`` for a file this version cannot read."""
    path = Path(folder) / OPTIONS_FILE
    if not path.is_file():
        return None
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        if body.get("format") != OPTIONS_FORMAT:
            raise InvalidInputError(f"{path} has format {body.get('format')!r}; this version reads {OPTIONS_FORMAT}: "
                                    "lay the folder out again with `retrieval-draft serve`")
        options = dict(body["options"])
        return ServeOptions(**{**options, "datastore": tuple(options.get("datastore", ())),
                               "drafters": tuple(options.get("drafters", ()))})
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise InvalidInputError(f"{path} is not a retrieval-draft options file ({error})") from error
