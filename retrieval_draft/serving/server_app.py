"""What ``retrieval-draft serve`` adds to the app that ``transformers serve`` builds.

``ours_in_app(name)`` wraps HF's app factory (``transformers.cli.serving.server.build_server``,
looked up when the server starts) for the duration of the server, so that the app, serving the
model served as ``name``, with our decoding or (``--plain``) without:

- answers llama.cpp's ``/infill`` (``infill.add_infill_route``);
- stops a generation whose client disconnects (``disconnect.StopWhenClientGone``);
- hands each request's stopping criteria to the model's ``generate`` (``request_stops``: the
  model manager's models get ``with_request_stops``, the inference thread runs each job in the
  context of the request that submitted it).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from retrieval_draft.serving.disconnect import StopWhenClientGone
from retrieval_draft.serving.infill import add_infill_route
from retrieval_draft.serving.request_stops import jobs_in_request_context, with_request_stops


def _stopping_models(manager) -> None:
    """Make ``manager`` (HF's ``ModelManager``) hand out models with ``with_request_stops``."""
    load = manager.load_model_and_processor

    def load_stopping(*args, **kwargs):
        model, processor = load(*args, **kwargs)
        return with_request_stops(model), processor

    manager.load_model_and_processor = load_stopping


@contextlib.contextmanager
def ours_in_app(name: str) -> Iterator[None]:
    """Within the block, the app HF's server builds has our additions (module docstring)."""
    from transformers.cli.serving import server

    build = server.build_server

    def build_ours(*args, **kwargs):
        app = build(*args, **kwargs)
        _stopping_models(kwargs["model_manager"] if "model_manager" in kwargs else args[0])
        add_infill_route(app, kwargs["completion_handler"] if "completion_handler" in kwargs else args[2], name)
        app.add_middleware(StopWhenClientGone)
        return app

    server.build_server = build_ours
    try:
        with jobs_in_request_context():
            yield
    finally:
        server.build_server = build
