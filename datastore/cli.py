"""The ``retrieval-draft`` console script: the runtime's ``generate`` plus the builder's commands.

    retrieval-draft generate --prompt "..." [--chat] [--max-new-tokens N] [--compare]
    retrieval-draft build / repo / inspect / merge / stats / export   (datastores; see ``commands``)
    retrieval-draft cache [--model M] [--reset]             (the cost curves and rates kept; ``retrieval_draft.cli.cache``)
    retrieval-draft serve [--model M] [--datastore S] [--port P]   (HTTP, through transformers serve; ``serving.command``)

It lives with the builder because it joins both packages, and imports run one
way: from here into the runtime. Errors we raise on purpose print as one line
(``error: ...``) with exit code 2; Ctrl-C prints ``interrupted`` with exit code 130.
"""

from __future__ import annotations

import argparse
import sys

from retrieval_draft import __version__
from retrieval_draft.cli.cache import add_cache
from retrieval_draft.cli.generate import add_generate, run
from retrieval_draft.serving.command import add_serve
from retrieval_draft_datastore.commands import register


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="retrieval-draft",
        description="Generate text faster with retrieval drafts, and build the datastores they draft from.",
    )
    parser.add_argument("--version", action="version", version=f"retrieval-draft {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="the command to run (retrieval-draft COMMAND --help shows its options)")
    add_generate(sub)
    register(sub)  # build, repo, inspect, merge, stats, export
    add_cache(sub)
    add_serve(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
