"""``retrieval-draft serve``: a model over HTTP with our decoding, through ``transformers serve``.

    retrieval-draft serve [--model M] [--datastore S ...] [--drafters a,b] [--tree-budget N]
                          [--max-draft-len N] [--fixed-tree] [--prefix-cache-bytes N]
                          [--host H] [--port P] [--device D] [--plain] [--layout-only]

Checks every option first (settings, drafter names, each store opened and matched to the model's
tokenizer, the serving packages, the port), lays out the model folder (``folder.lay_out``), then
runs HF's own server in this process, as ``transformers serve FOLDER --trust-remote-code`` would:
OpenAI-style ``/v1/completions`` (with ``suffix``, which HF's server appends to the answer: the
model never reads it), ``/v1/chat/completions``, streamed or not, one request at a time per model, and
llama.cpp's ``/infill`` for editors' fill-in-the-middle requests (``infill``). Clients name the
model as the first line printed says (``smollm2-135m`` for the default). ``--plain`` serves the same model without our decoding (the
server to compare with); ``--layout-only`` prints the folder's path and exits, for running
``transformers serve`` yourself.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket

from retrieval_draft.config import DEFAULTS
from retrieval_draft.errors import InvalidInputError

SERVE_EXTRA = "pip install 'retrieval-draft[serve]' (or transformers[serving])"


def add_serve(sub) -> None:
    """Register the ``serve`` subcommand on an argparse subparsers object."""
    serve = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-style API) with our decoding, "
                                         "through `transformers serve`")
    serve.add_argument("--model", default=None,
                       help="local HF model folder, .gguf file, or smollm2-135m / gemma3-270m / qwen2.5-coder-0.5b "
                            "(default: smollm2-135m)")
    serve.add_argument("--datastore", action="append", default=None,
                       help="datastore folder built by `retrieval-draft build` or `repo`; repeat to draft from several")
    serve.add_argument("--drafters", default=None, help="comma list of drafter names (default: the plugin's menu)")
    serve.add_argument("--tree-budget", type=int, default=DEFAULTS.tree_budget, help="most draft nodes per tree")
    serve.add_argument("--max-draft-len", type=int, default=DEFAULTS.max_draft_len, help="deepest draft path in tokens")
    serve.add_argument("--fixed-tree", action="store_true", help="always verify --tree-budget nodes (no cost-aware sizing)")
    serve.add_argument("--prefix-cache-bytes", type=int, default=DEFAULTS.prefix_cache_bytes,
                       help="most bytes of KV rows kept between requests (0: every request reads its whole prompt)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.add_argument("--device", default="auto", help="transformers serve's --device (auto, cpu, cuda:0, ...)")
    serve.add_argument("--plain", action="store_true", help="serve the model without our decoding (to compare with)")
    serve.add_argument("--layout-only", action="store_true", help="lay out the model folder, print its path, exit")
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Check, lay out, serve (see the module docstring); returns the exit code."""
    from retrieval_draft.serving.folder import lay_out, model_files, served_name
    from retrieval_draft.serving.options import ServeOptions

    options = None if args.plain else ServeOptions(
        datastore=tuple(args.datastore or ()),
        drafters=tuple(name.strip() for name in args.drafters.split(",") if name.strip()) if args.drafters else (),
        tree_budget=args.tree_budget, max_draft_len=args.max_draft_len, adaptive_tree=not args.fixed_tree,
        prefix_cache_bytes=args.prefix_cache_bytes,
    )
    if args.plain:
        ours = [flag for flag, given in (("--datastore", args.datastore), ("--drafters", args.drafters),
                                         ("--fixed-tree", args.fixed_tree)) if given]
        if ours:
            raise InvalidInputError(f"--plain serves the model without our decoding: drop {', '.join(ours)}")
    if not args.layout_only:
        check_serving_installed()
        check_port_free(args.host, args.port)
    sources = model_files(args.model)
    if options is not None and options.datastore:
        check_stores(options, sources)
    folder = lay_out(args.model, options)
    if args.layout_only:
        print(folder)
        return 0
    name = served_name(args.model)
    what = "plain HF generate" if args.plain else "retrieval-draft decoding"
    print(f"serving {name} with {what} at http://{args.host}:{args.port}/v1 (model name: {name}; folder {folder})",
          flush=True)
    return start_server(folder, args.host, args.port, args.device, trust_remote_code=not args.plain)


def check_serving_installed() -> None:
    """``InvalidInputError`` naming the install command when ``transformers serve``'s packages are missing."""
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        raise InvalidInputError(f"serving needs fastapi, uvicorn and openai: {SERVE_EXTRA}")


def check_port_free(host: str, port: int) -> None:
    """``InvalidInputError`` when ``host:port`` cannot be listened on (in use, or not this machine's)."""
    if not 0 < port < 65536:
        raise InvalidInputError(f"--port must be 1..65535, got {port}")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        reason = "is in use (pick another with --port)" if error.errno == errno.EADDRINUSE else f"cannot be used: {error.strerror}"
        raise InvalidInputError(f"{host}:{port} {reason}") from None


def check_stores(options, sources) -> None:
    """Open every store of ``options`` once (verifying its files) and match it to the model's
    tokenizer and vocabulary, so a bad store stops the server before it starts."""
    from transformers import AutoConfig

    from retrieval_draft.drafters.datastore import open_checked_stores
    from retrieval_draft.model.models import load_tokenizer

    tokenizer = load_tokenizer(str(sources[-1]))
    config = AutoConfig.from_pretrained(str(sources[0]), local_files_only=True)
    vocab_size = int(config.get_text_config().vocab_size)
    open_checked_stores(list(options.datastore), vocab_size=vocab_size, tokenizer=tokenizer)


def start_server(folder, host: str, port: int, device: str, trust_remote_code: bool) -> int:
    """Run ``transformers serve`` on ``folder`` in this process until it stops (Ctrl-C). The server is
    given the folder's last part as the model (from its parent folder), so clients ask for that name;
    it also answers llama.cpp's ``/infill`` for that model and stops a generation whose client left
    (``server_app.ours_in_app``)."""
    from transformers.cli.transformers import app

    from retrieval_draft.serving.server_app import ours_in_app

    log = logging.getLogger("retrieval_draft.serving")
    log.setLevel(logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[retrieval-draft] %(message)s"))
    log.addHandler(handler)
    os.chdir(folder.parent)
    argv = ["serve", folder.name, "--host", host, "--port", str(port), "--device", device]
    argv += ["--trust-remote-code"] if trust_remote_code else []
    try:
        with ours_in_app(folder.name):
            app(argv, prog_name="transformers", standalone_mode=False)
    except SystemExit as stop:  # typer's own exit
        return int(stop.code or 0)
    return 0
