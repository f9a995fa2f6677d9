"""The hub's hot routes (``/v1/fetch/begin``, ``/v1/fetch/exchange``, ``/v1/workers/heartbeat``) as plain ASGI, in
front of FastAPI.

Every reader makes these requests all through an update, so their per-request cost is the hub's. Through FastAPI
each one paid for routing, dependency resolution, a JSON parse into dicts, validation of those dicts, and then
validation and encoding of the reply once more (the route's response model); here the body is validated from its
bytes in one call (``model_validate_json``, the same strict models) and the reply is encoded from the model in one
call (``model_dump_json``). What the routes do is unchanged: the same ``HubState`` calls under the same
credential check, each on the event loop when the state's lock is free and else on a state thread
(``StateCalls.short``: the event loop never waits for the state's lock), the same answers, the same errors (a ``TensorHubError`` with the status FastAPI's handler gives
it, a malformed body 422 ``InvalidRequest``). The bearer token is checked before this (``app._TokenGate``),
the body's size by ``app._BodyLimit``, and the hub instance is stamped on the reply by ``_StampInstance``.

A heartbeat is answered on the event loop without the state lock (``HubState.heartbeat_unlocked``); only one that
must clear a suspicion or wait for retention lists goes to a state thread. Its ``worker`` query parameter is checked
as FastAPI checked it (1 to 256 characters, else 422 ``InvalidRequest``).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from urllib.parse import parse_qsl
from typing import Awaitable, Callable

from pydantic import BaseModel, ValidationError

from tensorhub_verl import errors
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.changes import ReaderPark, Wake
from tensorhub_verl.ros.hub.state_calls import StateCalls
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER

_CREDENTIAL = CREDENTIAL_HEADER.lower().encode()
_CREDENTIAL_MAX = 256
_ACCEPT_ENCODING = b"accept-encoding"
_JSON = (b"content-type", b"application/json")
_GZIP = (b"content-encoding", b"gzip")
GZIP_MIN_BYTES = 1024
"""Replies from this size up (a manifest, a first exchange that brings a source's data-plane metadata) are gzipped
for clients that accept it: readers in another datacenter than the hub get them across the WAN. Smaller ones
gain less than the compression costs."""


def gzipped(body: bytes, accept_encoding: str) -> bytes | None:
    """``body`` gzipped when it is large enough and ``accept_encoding`` (the request's header) lists gzip."""
    if len(body) < GZIP_MIN_BYTES or "gzip" not in accept_encoding.lower():
        return None
    return gzip.compress(body, 6)


def status_of(exc: errors.TensorHubError, table: list[tuple[type, int]]) -> int:
    """The HTTP status of a typed error: the first class of ``table`` it is an instance of, else 400."""
    return next((code for cls, code in table if isinstance(exc, cls)), 400)


def error_body(exc: errors.TensorHubError) -> bytes:
    tensor = exc.tensor if isinstance(exc, errors.ManifestMismatch) and exc.tensor else None
    return json.dumps(msg.ErrorReply(error=type(exc).__name__, detail=str(exc), tensor=tensor).body()).encode()


def invalid_detail(problems: list[dict]) -> str:
    """A 422's detail: the first few problems, each as ``loc: message``."""
    return "malformed request: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in problems[:5])


def _begin(state: HubState, req: msg.BeginFetch, credential: str) -> msg.BeginFetchReply:
    with state.acting_as(req.worker, credential):
        state.begin_fetch(req)
        first = None
        if req.want:
            first = state.exchange(msg.Exchange(
                worker=req.worker, holder=req.holder, model=req.model, version=req.version, layout=req.layout,
                want=req.want, run_chunks=req.run_chunks))
        return msg.BeginFetchReply(first=first)


def _exchange(state: HubState, req: msg.Exchange, credential: str, park: ReaderPark | None = None,
              woken: Wake | None = None) -> msg.ExchangeReply:
    with state.acting_as(req.worker, credential):
        return state.exchange(req, park, woken)


async def begin(state: HubState, off_loop: StateCalls, req: msg.BeginFetch, credential: str) -> msg.BeginFetchReply:
    """``/v1/fetch/begin``: registers the fetch and, when it wants some, answers its first exchange."""
    return await off_loop.short(state.lock, _begin, state, req, credential)


async def exchange(state: HubState, off_loop: StateCalls, req: msg.Exchange, credential: str) -> msg.ExchangeReply:
    """``/v1/fetch/exchange``. One that may wait for work parks on the event loop and holds no thread while it
    waits: a thousand idle readers then hold no threads that others need. The first try books the reports; when
    it gets no work and the hub says the fetch waits for some, the same state call parks the reader
    (``HubState.exchange``), which then waits until a change may give it work (``Changes``: a report it can use,
    a version came or went, a source failed) or ``wait_s`` passes, and asks again; the leases any try revoked are
    all returned."""
    if not req.wait_s:
        return await off_loop.short(state.lock, _exchange, state, req, credential)
    deadline = time.monotonic() + req.wait_s
    loop = asyncio.get_running_loop()
    current, woken, revoked = req.model_copy(update={"wait_s": 0.0}), None, set()
    while True:
        park = ReaderPark(loop) if time.monotonic() < deadline else None
        reply = await off_loop.short(state.lock, _exchange, state, current, credential, park, woken)
        revoked.update(reply.revoked)
        if park is None or not park.parked:
            break
        awake, woken = await state.changes.wait_parked(park, deadline - time.monotonic())
        if not awake:
            break
        current = req.model_copy(update={"completed": [], "failed": [], "wait_s": 0.0})
    return reply.model_copy(update={"revoked": sorted(revoked)}) if revoked else reply


HEARTBEAT_PATH = "/v1/workers/heartbeat"
_WORKER_MAX = 256


def locked_heartbeat(state: HubState, worker: str, credential: str) -> msg.WorkerAck:
    """A heartbeat under the state lock: one that clears a suspicion, or finds the retention lists changing."""
    with state.acting_as(worker, credential):
        return state.heartbeat(worker)


async def heartbeat(state: HubState, off_loop: StateCalls, worker: str, credential: str) -> msg.WorkerAck:
    """``/v1/workers/heartbeat``: on the event loop without the state lock, or, when it needs the lock, on a state
    thread (never in Starlette's pool, where drains and publishes may hold every thread)."""
    ack = state.heartbeat_unlocked(worker, credential)
    return ack if ack is not None else await off_loop(locked_heartbeat, state, worker, credential)


def _query_worker(query: bytes) -> str | None:
    """The ``worker`` query parameter (the last one given), None when absent."""
    worker = None
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if name == "worker":
            worker = value
    return worker


Handler = Callable[[HubState, StateCalls, BaseModel, str], Awaitable[BaseModel]]
ROUTES: dict[str, tuple[type[BaseModel], Handler]] = {
    "/v1/fetch/begin": (msg.BeginFetch, begin),
    "/v1/fetch/exchange": (msg.Exchange, exchange),
}


class FetchRoutes:
    """ASGI: answers POSTs to ``ROUTES`` itself and hands every other request to ``app`` (FastAPI)."""

    def __init__(self, app, state: HubState, statuses: list[tuple[type, int]], off_loop: StateCalls):
        self.app, self.state, self.statuses, self.off_loop = app, state, statuses, off_loop

    async def __call__(self, scope, receive, send):
        post = scope["type"] == "http" and scope["method"] == "POST"
        path = scope.get("path", "") if post else ""
        route = ROUTES.get(path)
        if route is None and path != HEARTBEAT_PATH:
            return await self.app(scope, receive, send)
        credential, accept = b"", b""
        for name, value in scope.get("headers") or ():
            if name == _CREDENTIAL:
                credential = value
            elif name == _ACCEPT_ENCODING:
                accept = value
        if len(credential) > _CREDENTIAL_MAX:
            return await _answer(send, 422, _invalid(f"{CREDENTIAL_HEADER}: longer than {_CREDENTIAL_MAX} "
                                                     "characters"))
        if route is None:
            return await self._heartbeat(scope, send, credential.decode("latin-1"))
        model, handler = route
        body = await _read_body(receive)
        try:
            req = model.model_validate_json(body)
        except ValidationError as exc:
            return await _answer(send, 422, _invalid(invalid_detail(exc.errors())))
        try:
            reply = await handler(self.state, self.off_loop, req, credential.decode("latin-1"))
        except errors.TensorHubError as exc:
            return await _answer(send, status_of(exc, self.statuses), error_body(exc))
        body = reply.model_dump_json().encode()
        packed = gzipped(body, accept.decode("latin-1"))
        await _answer(send, 200, body if packed is None else packed, zipped=packed is not None)

    async def _heartbeat(self, scope, send, credential: str) -> None:
        worker = _query_worker(scope.get("query_string", b""))
        if worker is None or not 1 <= len(worker) <= _WORKER_MAX:
            problem = "Field required" if worker is None else f"must have 1 to {_WORKER_MAX} characters"
            return await _answer(send, 422, _invalid(f"malformed request: query.worker: {problem}"))
        try:
            ack = await heartbeat(self.state, self.off_loop, worker, credential)
        except errors.TensorHubError as exc:
            return await _answer(send, status_of(exc, self.statuses), error_body(exc))
        await _answer(send, 200, ack.model_dump_json().encode())


def _invalid(detail: str) -> bytes:
    return json.dumps(msg.ErrorReply(error="InvalidRequest", detail=detail).body()).encode()


async def _read_body(receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _answer(send, status: int, body: bytes, zipped: bool = False) -> None:
    headers = [_JSON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, _GZIP] if zipped else headers})
    await send({"type": "http.response.body", "body": body})
