"""General-text workloads of the benchmark, built from text this interpreter ships.

- ``translate``: translate English sentences (the Zen of Python, the ``this``
  module, and sentences of standard-library docstrings) into French, German or Spanish.
- ``summarize``: summarise a prose passage: ``heapq.__about__`` (an essay on
  heaps and tournaments), the history section of CPython's ``LICENSE.txt``, and
  the module docstrings of ``turtle``, ``statistics``, ``socketserver`` and ``configparser``.
- ``qa``: open-domain questions with short factual answers, written for this benchmark.
- ``math``: arithmetic word problems asking for step-by-step working, written for this benchmark.
- ``rag``: retrieval-augmented QA: a long passage (a standard-library module
  docstring or the license history) followed by a question it answers.
- ``multiturn``: a conversation of two user turns with an assistant reply in
  between (written for this benchmark); the model writes the second reply.

Every prompt is a chat request; ``BenchPrompt.turns`` holds the earlier turns of
multi-turn prompts. Fixed order, so ``n`` prompts are always the first ``n``.
"""

from __future__ import annotations

import codecs
import importlib
import importlib.util
import sysconfig
from pathlib import Path

TEXT_WORKLOADS = ("translate", "summarize", "qa", "math", "rag", "multiturn")


def zen_of_python() -> list[str]:
    """The aphorisms of ``import this``, decoded without importing it (which prints them)."""
    spec = importlib.util.find_spec("this")
    source = Path(spec.origin).read_text(encoding="utf-8")
    encoded = source.split('s = """', 1)[1].split('"""', 1)[0]
    lines = codecs.decode(encoded, "rot13").splitlines()
    return [line.strip() for line in lines[2:] if line.strip()]


def license_history() -> str:
    """Section A ("History of the software") of CPython's ``LICENSE.txt``."""
    text = (Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text(encoding="utf-8")
    start = text.index("A. HISTORY OF THE SOFTWARE")
    end = text.index("B. TERMS AND CONDITIONS")
    return text[start:end].strip()


def module_doc(module: str, attribute: str = "__doc__") -> str:
    """A module's docstring (or another string attribute), stripped."""
    return str(getattr(importlib.import_module(module), attribute)).strip()


TRANSLATE_REQUESTS = (
    ("French", 0, 5),
    ("German", 5, 10),
    ("Spanish", 10, 15),
    ("French", 15, 19),
    ("Spanish", 0, 4),
    ("German", 12, 17),
)

SUMMARY_SOURCES = (
    ("heapq", "__about__"),
    ("license", ""),
    ("turtle", "__doc__"),
    ("statistics", "__doc__"),
    ("socketserver", "__doc__"),
    ("configparser", "__doc__"),
)

QA_QUESTIONS = (
    "Why is the sky blue?",
    "Who wrote the novel Pride and Prejudice, and when was it published?",
    "What causes the seasons on Earth?",
    "How does a vaccine train the immune system?",
    "What is the largest planet in the solar system, and what is it made of?",
    "Why do we have leap years?",
)

MATH_PROBLEMS = (
    "A baker makes 24 muffins in the morning and 18 in the afternoon. She sells 35 and gives 4 to a "
    "neighbour. How many muffins are left? Show your working step by step.",
    "A train travels 180 km in 2 hours and then 150 km in 3 hours. What is its average speed over the "
    "whole trip? Show your working step by step.",
    "Tom has three times as many marbles as Ann. Together they have 64 marbles. How many does each have? "
    "Show your working step by step.",
    "A shirt costs 40 dollars. It is discounted by 25 percent, and then a 10 percent tax is added to the "
    "discounted price. What is the final price? Show your working step by step.",
    "A rectangle is 12 cm long and its width is half its length. What are its perimeter and its area? "
    "Show your working step by step.",
    "A school has 480 pupils. 5/8 of them walk to school and a third of the rest come by bus. How many "
    "come by bus? Show your working step by step.",
)

RAG_QUESTIONS = (
    ("license", "", "At which organisations did Guido van Rossum continue Python's development, in order?"),
    ("json", "__doc__", "How do I pretty-print JSON with sorted keys using this module?"),
    ("socketserver", "__doc__", "What are the four basic concrete server classes, and how do I make a forking server?"),
    ("configparser", "__doc__", "What does the 'interpolation' argument do, and what is the default?"),
    ("argparse", "__doc__", "How do I add an optional flag that stores True, according to this text?"),
    ("statistics", "__doc__", "Which functions compute averages, and which compute measures of spread?"),
)

MULTITURN = (
    (
        "I'm planning a vegetable garden in a small backyard. What should I grow first?",
        "Good starters for a small plot are lettuce, radishes, bush beans, courgettes and cherry tomatoes: they "
        "grow quickly, need little space and forgive mistakes. Start with three or four of them.",
        "Great. How should I arrange those in a 2 by 3 metre bed so they all get enough sun?",
    ),
    (
        "Can you explain what a linked list is?",
        "A linked list stores items in nodes; each node holds a value and a reference to the next node. "
        "Unlike an array, it needs no contiguous memory, and inserting at the front takes constant time.",
        "When would I choose a linked list over an array in practice? Give concrete examples.",
    ),
    (
        "I want to start running. I'm 40 and haven't exercised in years.",
        "A walk-run plan is a safe start: three times a week, alternate one minute of easy running with two "
        "minutes of walking for 20 minutes, and add a little running each week.",
        "What should I eat before and after those sessions?",
    ),
    (
        "Write a limerick about a cat who loves boxes.",
        "There once was a cat named Lenore,\nWho found every box on the floor.\nShe'd squeeze and she'd cram,\n"
        "In a box made for jam,\nThen look up and beg you for more.",
        "Now write a second verse where the cat finds a box that is far too small.",
    ),
    (
        "What's the difference between a virus and a bacterium?",
        "Bacteria are single-celled living organisms that reproduce on their own; viruses are much smaller, "
        "carry only genetic material in a protein coat and can reproduce only inside a host cell.",
        "So why don't antibiotics work against viruses?",
    ),
    (
        "Help me write an email asking my manager for a day off next Friday.",
        "Subject: Day off request for Friday\n\nHi Sam,\n\nI'd like to request a day off next Friday. My work "
        "is on track, and Alex has agreed to cover anything urgent.\n\nThanks,\nJordan",
        "Make it a bit more formal and mention that I will be reachable by phone.",
    ),
)


def passage(module: str, attribute: str) -> tuple[str, str]:
    """(name, text) of a source passage: the license history or a module attribute."""
    if module == "license":
        return "LICENSE.txt history", license_history()
    return f"{module}.{attribute}", module_doc(module, attribute)


def text_prompts(workload: str, n: int) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """The first ``n`` prompts of a general-text workload: (prompt id, last user message,
    earlier turns as (role, content) pairs)."""
    if workload == "translate":
        zen = zen_of_python()
        made = []
        for language, start, stop in TRANSLATE_REQUESTS:
            text = "\n".join(zen[start:stop])
            made.append((f"zen-{language.lower()}-{start}", f"Translate into {language}:\n\n{text}", ()))
    elif workload == "summarize":
        made = []
        for module, attribute in SUMMARY_SOURCES:
            name, text = passage(module, attribute)
            made.append((name, f"Summarise the following text in a short paragraph:\n\n{text}", ()))
    elif workload == "qa":
        made = [(f"qa-{i}", question, ()) for i, question in enumerate(QA_QUESTIONS)]
    elif workload == "math":
        made = [(f"math-{i}", problem, ()) for i, problem in enumerate(MATH_PROBLEMS)]
    elif workload == "rag":
        made = []
        for module, attribute, question in RAG_QUESTIONS:
            name, text = passage(module, attribute)
            made.append((name, f"Answer the question using the document.\n\nDocument:\n{text}\n\nQuestion: {question}", ()))
    elif workload == "multiturn":
        made = [
            (f"multiturn-{i}", second, (("user", first), ("assistant", reply)))
            for i, (first, reply, second) in enumerate(MULTITURN)
        ]
    else:
        raise ValueError(f"unknown text workload {workload!r}; choose from {', '.join(TEXT_WORKLOADS)}")
    return made[:n]
