"""llama.cpp's ``/infill`` on ``retrieval-draft serve``: fill-in-the-middle as editors ask for it.

Editor plugins made for llama.cpp's server (llama.vim, llama.vscode) send the text before the cursor,
the text after it, chunks of other files and what was typed at the cursor, and read back the middle.
This route answers them on HF's own server: ``add_infill_route`` adds ``POST /infill`` to the FastAPI
app that ``transformers serve`` builds (``server_app.ours_in_app``), lays the request out as the
model's FIM prompt (``fim.fim_prompt``) and hands it to HF's ``/v1/completions`` handler, so the
request runs through the served model's ``generate`` (ours, or plain HF's with ``--plain``) like any
other: same queue, same prefix cache, same exactness.

Request (JSON), llama.cpp's names: ``input_prefix``, ``input_suffix`` (strings), ``input_extra`` (a list
of ``{"filename", "text"}``), ``prompt`` (typed at the cursor, appended to the prefix), ``n_predict``
(new tokens; missing or negative: the server's default, 1024; 0 reads the prompt into the cache and
answers nothing), ``temperature`` (default 0: greedy, where llama.cpp's default is 0.8), ``top_k``,
``top_p``, ``seed``, ``stop``, ``stream``, and llama.cpp's two editor stops, ``n_indent`` and
``t_max_predict_ms`` (``editor_stops``). Other fields llama.cpp takes (``samplers``, ``cache_prompt``,
``response_fields``, ``id_slot``, ``model``...) are accepted and ignored. The middle ends at the
model's eos or at a token that closes a FIM middle (``fim.end_token_ids``), as llama.cpp's
end-of-generation tokens do, or where an editor stop ends it.

Answer: ``{"content", "tokens_predicted", "tokens_evaluated", "stop": true, "stop_type", "model",
"truncated": false}`` (``stop_type``: ``"limit"`` when ``n_predict`` ran out or an editor stop ended
it, else ``"eos"``; ``n_indent`` cuts ``content`` before the short line's text); streamed,
one ``data: {"content": ..., "stop": false}`` line per piece and a last one with ``"stop": true`` and
the counts. Errors come as llama.cpp words them, ``{"error": {"code", "message", "type"}}``: 400 for a
bad field, 501 for a model without FIM tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from retrieval_draft.errors import InvalidInputError, NoFillInMiddleError
from retrieval_draft.serving.editor_stops import EditorStops, short_line_at
from retrieval_draft.serving.fim import ExtraChunk, end_token_ids, fim_prompt, fim_template
from retrieval_draft.serving.request_stops import add_request_stop, remove_request_stops

DEFAULT_N_PREDICT = 1024  # HF's server's floor for max_new_tokens when a request names none


@dataclass(frozen=True)
class InfillRequest:
    """An ``/infill`` body, checked. ``n_predict`` None: the server's default; ``temperature`` 0: greedy."""

    before: str = ""
    after: str = ""
    extra: tuple[ExtraChunk, ...] = ()
    typed: str = ""
    n_predict: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    n_indent: int = 0
    t_max_predict_ms: int | None = None

    def editor_stops(self, tokenizer) -> EditorStops | None:
        """The request's ``n_indent`` and ``t_max_predict_ms`` as one criterion; None when it sets neither."""
        if self.n_indent == 0 and self.t_max_predict_ms is None:
            return None
        return EditorStops(tokenizer, self.n_indent, self.t_max_predict_ms)


def _field(body: dict, name: str, kinds: tuple[type, ...], default):
    """``body[name]`` when it is one of ``kinds`` (never a bool for a number), ``default`` when absent;
    ``InvalidInputError`` otherwise."""
    value = body.get(name, default)
    if value is default:
        return value
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        wanted = " or ".join({str: "a string", int: "an integer", float: "a number", bool: "true or false",
                              list: "a list"}[kind] for kind in kinds)
        raise InvalidInputError(f"{name} must be {wanted}, got {json.dumps(value)[:60]}")
    return value


def _extra(body: dict) -> tuple[ExtraChunk, ...]:
    """``input_extra``'s chunks; a chunk's ``filename`` defaults to llama.cpp's "tmp"."""
    chunks = []
    for index, chunk in enumerate(_field(body, "input_extra", (list,), [])):
        if not isinstance(chunk, dict):
            raise InvalidInputError(f"input_extra[{index}] must be an object with filename and text")
        chunks.append(ExtraChunk(_field(chunk, "filename", (str,), "tmp"), _field(chunk, "text", (str,), "")))
    return tuple(chunks)


def parse_infill(body: dict) -> InfillRequest:
    """The checked request of an ``/infill`` body; ``InvalidInputError`` (one line) on a bad field."""
    n_predict = _field(body, "n_predict", (int,), None)
    temperature = float(_field(body, "temperature", (int, float), 0.0))
    top_k = _field(body, "top_k", (int,), 0)
    top_p = _field(body, "top_p", (int, float), None)
    seed = _field(body, "seed", (int,), None)
    stop = _field(body, "stop", (list, str), [])
    stop = [stop] if isinstance(stop, str) else stop
    if temperature < 0 or top_k < 0 or top_p is not None and not 0 < top_p <= 1:
        raise InvalidInputError(f"temperature must be >= 0, top_k >= 0 and top_p in (0, 1], got "
                                f"{temperature}, {top_k}, {top_p}")
    if not all(isinstance(word, str) for word in stop):
        raise InvalidInputError("stop must be a list of strings")
    n_indent = _field(body, "n_indent", (int,), 0)
    if n_indent < 0:
        raise InvalidInputError(f"n_indent must be >= 0, got {n_indent}")
    t_max_predict_ms = _field(body, "t_max_predict_ms", (int,), None)
    return InfillRequest(
        before=_field(body, "input_prefix", (str,), ""), after=_field(body, "input_suffix", (str,), ""),
        extra=_extra(body), typed=_field(body, "prompt", (str,), ""),
        n_predict=None if n_predict is None or n_predict < 0 else n_predict, temperature=temperature,
        top_k=top_k, top_p=None if top_p is None else float(top_p),
        seed=None if seed is None or seed < 0 else seed, stop=tuple(word for word in stop if word),
        stream=_field(body, "stream", (bool,), False), n_indent=n_indent,
        t_max_predict_ms=None if t_max_predict_ms is None or t_max_predict_ms <= 0 else t_max_predict_ms,
    )


def completion_body(request: InfillRequest, name: str, tokenizer, generation_config) -> dict:
    """The ``/v1/completions`` body (HF's server's fields) that asks ``name`` for ``request``'s middle:
    the FIM prompt of ``tokenizer`` (``NoFillInMiddleError`` when it has none) and a generation config
    made from the model's ``generation_config`` with the request's sampling and the middle's end tokens."""
    template = fim_template(tokenizer, name)
    config = generation_config.to_diff_dict()
    own = config.get("eos_token_id")
    own = [] if own is None else [own] if isinstance(own, int) else list(own)
    config["eos_token_id"] = own + [token for token in end_token_ids(tokenizer, template) if token not in own]
    config["do_sample"] = request.temperature > 0
    for key in ("temperature", "top_k", "top_p"):
        config.pop(key, None)
    if request.temperature > 0:
        config.update({"temperature": request.temperature, "top_k": request.top_k})
        config.update({} if request.top_p is None else {"top_p": request.top_p})
    if request.n_predict is None:
        config["max_new_tokens"] = max(config.get("max_new_tokens") or 0, DEFAULT_N_PREDICT)
    body = {"model": name, "prompt": fim_prompt(template, request.before, request.after, request.extra, request.typed),
            "stream": request.stream, "generation_config": json.dumps(config)}
    body.update({} if request.n_predict is None else {"max_tokens": request.n_predict})
    body.update({"stop": list(request.stop)} if request.stop else {})
    body.update({} if request.seed is None else {"seed": request.seed})
    return body


def llama_answer(text: str, finish_reason: str | None, usage: dict | None, name: str,
                 stops: EditorStops | None = None) -> dict:
    """llama.cpp's closing ``/infill`` answer for a middle ``text`` from HF's completion fields and
    the request's editor stops (``stops``, after its generation): cut where ``n_indent`` ended it."""
    usage = usage or {}
    fired = None if stops is None else stops.fired
    if fired == "indent":
        text = text[: short_line_at(text, stops.n_indent)]
    return {"content": text, "tokens_predicted": usage.get("completion_tokens", 0),
            "tokens_evaluated": usage.get("prompt_tokens", 0), "stop": True,
            "stop_type": "limit" if finish_reason == "length" or fired else "eos", "model": name, "truncated": False}


def llama_error(status: int, message: str):
    """A ``JSONResponse`` with llama.cpp's error body."""
    from fastapi.responses import JSONResponse

    kind = {400: "invalid_request_error", 501: "not_supported_error"}.get(status, "server_error")
    return JSONResponse({"error": {"code": status, "message": message, "type": kind}}, status_code=status)


def _sse(body: dict) -> str:
    """One server-sent event line as llama.cpp's server writes it."""
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


async def _llama_stream(events, name: str, stops: EditorStops | None):
    """HF's completion SSE stream (``events``: its response's body iterator) as llama.cpp's; the
    pieces are the model's text as it comes (as llama.cpp streams it, not cut by ``n_indent``)."""
    try:
        async for piece in events:
            for line in (piece if isinstance(piece, str) else piece.decode("utf-8")).split("\n\n"):
                if not line.startswith("data: "):
                    continue
                try:
                    chunk = json.loads(line[len("data: "):])
                except json.JSONDecodeError:  # HF writes its error events by string formatting
                    chunk = {"error": line[len("data: "):]}
                if "error" in chunk:
                    yield _sse({"error": {"code": 500, "message": str(chunk["error"]), "type": "server_error"}})
                    return
                (choice,) = chunk["choices"]
                if choice.get("finish_reason"):
                    yield _sse(llama_answer("", choice["finish_reason"], chunk.get("usage"), name, stops))
                elif choice.get("text"):
                    yield _sse({"content": choice["text"], "stop": False})
    finally:
        await events.aclose()  # a client gone mid-stream stops HF's generation too


def add_infill_route(app, completion_handler, name: str) -> None:
    """Add ``POST /infill`` to ``app`` (HF's server's FastAPI app), answered by ``completion_handler``
    (its ``/v1/completions`` handler) on the model served as ``name``."""
    from fastapi import HTTPException, Request
    from fastapi.responses import StreamingResponse

    async def infill(request, body):
        try:
            wanted = parse_infill(body)
            _, model, processor = completion_handler._resolve_model({"model": name})
            tokenizer = getattr(processor, "tokenizer", processor)
            completion = completion_body(wanted, name, tokenizer, model.generation_config)
            stops = wanted.editor_stops(tokenizer)
            added = None if stops is None else add_request_stop(stops)  # the generation is submitted in here
            try:
                answer = await completion_handler.handle_request(completion, request.state.request_id)
            finally:
                if added is not None:
                    remove_request_stops(added)
        except InvalidInputError as error:
            return llama_error(400, str(error))
        except NoFillInMiddleError as error:
            return llama_error(501, str(error))
        except HTTPException as error:
            return llama_error(error.status_code, str(error.detail))
        if wanted.stream:
            return StreamingResponse(_llama_stream(answer.body_iterator, name, stops), media_type="text/event-stream")
        completed = json.loads(answer.body)
        (choice,) = completed["choices"]
        return llama_answer(choice["text"], choice.get("finish_reason"), completed.get("usage"), name, stops)

    # FastAPI reads the parameters' kinds from real classes (this module's annotations are strings)
    infill.__annotations__ = {"request": Request, "body": dict}
    app.add_api_route("/infill", infill, methods=["POST"])
