"""A request whose client disconnects stops its generation: what an editor needs from a server.

Editors cancel a stale completion request as soon as the user types on, by closing its connection.
HF's server runs one ``generate`` at a time per model, so a generation nobody waits for holds up the
next request until it ends. HF stops a streamed one at its next token; a request answered in one
piece runs to its end. ``StopWhenClientGone``, an ASGI middleware on the server's app, gives every
POST request a ``ClientGone`` criterion (``request_stops``) and watches the connection once the
request's body is read: when the client leaves before the answer is complete, the criterion turns
true and the generation stops at its next token, streamed or not, with our decoding or plain HF's
(a request still queued behind another is then not generated at all). The server's log says so in
one line: ``[retrieval-draft] client gone: generation stopped after 37 new tokens``.

What it cannot stop: a prompt being read (one forward; the stop comes at the first new token).
The watch reads the connection's ASGI ``receive`` while the app may read it too (a streamed answer
listens for the disconnect itself); uvicorn, which ``transformers serve`` runs, answers every waiting
reader with the disconnect.
"""

from __future__ import annotations

import asyncio

from retrieval_draft.serving.request_stops import ClientGone, add_request_stop, remove_request_stops


class StopWhenClientGone:
    """ASGI middleware: each POST request's generation stops when its client disconnects."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        stop = ClientGone()
        read, answered = asyncio.Event(), asyncio.Event()

        def note(message: dict) -> dict:
            if message["type"] == "http.request" and not message.get("more_body", False):
                read.set()
            elif message["type"] == "http.disconnect" and not answered.is_set():
                stop.gone.set()
            return message

        async def receive_noted() -> dict:
            return note(await receive())

        async def send_noted(message: dict) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered.set()
            await send(message)

        async def watch() -> None:
            await read.wait()
            note(await receive())

        token = add_request_stop(stop)
        watcher = asyncio.ensure_future(watch())
        try:
            await self.app(scope, receive_noted, send_noted)
        finally:
            watcher.cancel()
            remove_request_stops(token)
