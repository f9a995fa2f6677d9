"""The hub's HTTP face: FastAPI routes over HubState, bearer-token auth, size limits, /metrics.

Every request body is a pydantic model (``messages.py``); a request that fails validation, is too
large, or lacks the token is answered with an error and changes nothing.

Two proofs: the shared bearer token (when set) admits a caller to the hub at all; the per-worker
credential (``X-TensorHub-Credential``, returned by registration) proves that a call acting for a worker
comes from that worker. Routes that act for a worker run inside ``HubState.acting_as``.

One rule for the state's lock: the event loop never waits for it. Plain (sync) routes run in Starlette's thread
pool. The async routes are the ones that must not queue behind that pool (heartbeats, the fetch path, long-polls):
they hand each state call to the hub's own small pool of state threads (``hub.state_calls``; the fetch path's
short calls run on the loop when the lock is free, ``StateCalls.short``) and park, while they wait
for a change, on ``HubState.changes`` without the lock. A heartbeat needs neither: it is answered on the loop
without the lock (``HubState.heartbeat_unlocked``), in front of FastAPI (``fetch_routes``).
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import time
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from tensorhub_verl import errors
from tensorhub_verl.ros.wire import hub_proof
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.errors import UnknownFetch, UnknownWorker
from tensorhub_verl.ros.hub.state_calls import StateCalls
from tensorhub_verl.ros.hub.fetch_routes import HEARTBEAT_PATH, FetchRoutes, error_body, gzipped, invalid_detail, \
    status_of
from tensorhub_verl.ros.hub.fetch_routes import heartbeat as hot_heartbeat
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.wire.hub_proof import HELLO_PATH
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER, INSTANCE_HEADER, JOB_KEY_HEADER
from tensorhub_verl.ros.planes.tcp_wire import advertised_host_problem
from tensorhub_verl.ros.wire.convert import manifest_to_msg

logger = logging.getLogger("tensorhub_verl.ros.hub")

DEFAULT_MAX_BODY_BYTES = 64 << 20
_FETCH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

_STATUS_OF = [
    (UnknownWorker, 404),
    (UnknownFetch, 404),
    (errors.VersionNotFound, 404),
    (errors.ManifestMismatch, 409),
    (errors.OverBudget, 429),
    (errors.InvalidRequest, 400),
    (errors.NotOwner, 403),
    (errors.JobKeyRequired, 403),
    (errors.Unauthorized, 401),
]

Credential = Annotated[str, Header(alias=CREDENTIAL_HEADER, max_length=256)]
JobKey = Annotated[str, Header(alias=JOB_KEY_HEADER, max_length=256)]


class _BodyLimit:
    """Refuses bodies over ``limit`` bytes with 413 before the route sees them (also for chunked uploads)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and int(declared) > self.limit:
            return await _send_error(send, 413, "InvalidRequest",
                                     f"request body of {int(declared)} bytes exceeds the hub's limit of {self.limit}")
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge()
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await _send_error(send, 413, "InvalidRequest", f"request body exceeds the hub's limit of {self.limit}")


class _TokenGate:
    """Answers 401 to a request without the hub's bearer token before anything else runs: no body is read, no
    route, validation or middleware below it sees the request, so a caller without the token costs the hub one
    header check. (The FastAPI dependency ``authorize`` stays as a second line and documents the scheme.)

    One request passes without the token: the hello (``wire.hub_proof``), answered here with the hub's proof,
    which clients check before they send the token, a job key or a credential on a connection."""

    def __init__(self, app, token: str | None, instance: str):
        self.app = app
        self.token = token
        self.expected = None if token is None else b"bearer " + token.encode()
        self.instance_id = instance
        self.instance = (INSTANCE_HEADER.lower().encode(), instance.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == HELLO_PATH:
            return await self._hello(scope, send)
        if self.expected is None or scope["type"] != "http":
            return await self.app(scope, receive, send)
        presented = b""
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                presented = value
                break
        scheme, _, rest = presented.partition(b" ")
        if hmac.compare_digest(scheme.lower() + b" " + rest, self.expected):
            return await self.app(scope, receive, send)
        body = json.dumps(msg.ErrorReply(error="Unauthorized", detail="missing or wrong bearer token; pass the "
                                         "hub's token (TENSORHUB_TOKEN)").body()).encode()
        # Connection: close, so the unread body of the refused request is never parsed as a next request.
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close"), self.instance]})
        await send({"type": "http.response.body", "body": body})

    async def _hello(self, scope, send) -> None:
        """The token-less challenge (``hub_proof``): the instance id and, with a token, the MAC of the token over
        the caller's nonce. One HMAC, no body read, no state touched: a stranger's hello costs the hub nothing
        more than a refused request."""
        nonce = ""
        for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
            if name == "nonce":
                nonce = value
        if not hub_proof.is_nonce(nonce):
            return await _send_error(send, 400, "InvalidRequest", "hello needs nonce=<32 hex digits>")
        answer = {"hub_instance": self.instance_id, "token": self.token is not None,
                  "proof": None if self.token is None else hub_proof.proof(self.token, nonce, self.instance_id)}
        body = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                self.instance]})
        await send({"type": "http.response.body", "body": body})


class _StampInstance:
    """Names the hub instance on every response (clients notice a restart). Plain ASGI: Starlette's
    BaseHTTPMiddleware costs a task group per request, a large share of a heartbeat."""

    def __init__(self, app, instance: str):
        self.app, self.header = app, (INSTANCE_HEADER.lower().encode(), instance.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def stamped(message):
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [h for h in message.get("headers", []) if h[0] != self.header[0]] + [self.header]
            await send(message)

        await self.app(scope, receive, stamped)


class _TooLarge(Exception):
    pass


async def _send_error(send, status: int, error: str, detail: str) -> None:
    body = json.dumps(msg.ErrorReply(error=error, detail=detail).body()).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class _HubCollector:
    def __init__(self, state: HubState):
        self.state = state

    def collect(self):
        snap = self.state.metrics_snapshot()
        served = CounterMetricFamily("tensorhub_bytes_served", "Bytes served by each worker as a source",
                                     labels=["worker"])
        for worker, n in sorted(snap["bytes_served"].items()):
            served.add_metric([worker], n)
        yield served
        deltas = CounterMetricFamily("tensorhub_delta_bytes", "Bytes of delta forms read, per model",
                                     labels=["model"])
        for model, n in sorted(snap.get("delta_bytes", {}).items()):
            deltas.add_metric([model], n)
        yield deltas
        holders = GaugeMetricFamily("tensorhub_version_holders", "Active holders of each version",
                                    labels=["model", "version", "layout"])
        for (model, version, layout), n in sorted(snap["holders"].items()):
            holders.add_metric([model, str(version), layout], n)
        yield holders
        by_model: dict[str, list[float]] = {}
        for model, seconds in snap["fetch_seconds"]:
            by_model.setdefault(model, []).append(seconds)
        latency = HistogramMetricFamily("tensorhub_fetch_seconds", "Fetch latency", labels=["model"])
        for model, samples in sorted(by_model.items()):
            buckets = [(str(b), sum(1 for s in samples if s <= b)) for b in _FETCH_BUCKETS]
            buckets.append(("+Inf", len(samples)))
            latency.add_metric([model], buckets, sum(samples))
        yield latency
        failures = CounterMetricFamily("tensorhub_read_failures", "Failed reads by source", labels=["worker"])
        for worker, n in sorted(snap["read_failures"].items()):
            failures.add_metric([worker], n)
        yield failures
        corrupt = CounterMetricFamily("tensorhub_corrupt_reads", "Reads whose bytes failed the chunk digest, by source",
                                      labels=["worker"])
        for worker, n in sorted(snap["corrupt_reads"].items()):
            corrupt.add_metric([worker], n)
        yield corrupt
        yield CounterMetricFamily("tensorhub_leases_revoked", "Leases revoked past their deadline",
                                  value=snap["leases_revoked"])
        yield GaugeMetricFamily("tensorhub_leases_in_flight", "Reads in flight", value=snap["leases_in_flight"])
        yield GaugeMetricFamily("tensorhub_workers", "Registered workers", value=snap["workers"])


def create_app(state: HubState, token: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
    async def authorize(request: Request) -> None:
        # async: a sync dependency would run in the thread pool for every request, so heartbeats and parked
        # long-polls would again wait for pool threads behind publishes and exchanges.
        if token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), token.encode()):
            raise errors.Unauthorized("missing or wrong bearer token; pass the hub's token (TENSORHUB_TOKEN)")

    app = FastAPI(title="TensorHub hub", version="1", dependencies=[Depends(authorize)])
    off_loop = StateCalls()
    registry = CollectorRegistry()
    registry.register(_HubCollector(state))

    @app.exception_handler(errors.TensorHubError)
    async def typed_error(_request: Request, exc: errors.TensorHubError):
        return Response(error_body(exc), status_code=status_of(exc, _STATUS_OF), media_type="application/json",
                        headers={INSTANCE_HEADER: state.instance})

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        body = msg.ErrorReply(error="InvalidRequest", detail=invalid_detail(exc.errors()))
        return JSONResponse(body.body(), status_code=422, headers={INSTANCE_HEADER: state.instance})

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True, "hub_instance": state.instance}

    @app.get(msg.HUB_INFO_PATH)
    def hub_info() -> msg.HubInfo:
        return msg.HubInfo(hub_instance=state.instance, plane=state.plane)

    keyless_refused = token is not None and not state.config.allow_keyless

    @app.post(msg.REGISTER_PATH)
    def register(req: msg.RegisterWorker, request: Request, credential: Credential = "",
                 job_key: JobKey = "") -> msg.WorkerAck:
        if keyless_refused and not job_key:
            # The token admits to the hub, a job key to a job: without one a worker would share the default job
            # with every other token holder (its NIXL metadata, its shard ranks, its models' latest).
            raise errors.JobKeyRequired(
                f"worker {req.worker!r} registered without a job key; this hub admits only workers of a job. "
                f"Give every worker of one job the same secret key (ClientConfig.job_key, $TENSORHUB_JOB_KEY; "
                f"a verl job makes one itself), or start the hub with --allow-keyless "
                f"(HubConfig.allow_keyless) on a cluster where every token holder is one job")
        registered_from = request.client.host if request.client else None
        problem = _advertised_address_problem(req, registered_from)
        if problem is not None:
            raise errors.InvalidRequest(problem)
        return state.register_worker(req, credential, job_key, registered_from)

    @app.post(HEARTBEAT_PATH)
    async def heartbeat(credential: Credential = "",
                        worker: str = Query(min_length=1, max_length=256)) -> msg.WorkerAck:
        # Answered before FastAPI (``fetch_routes``: on the event loop, without the state lock); declared here
        # for the API's schema, which the fuzz tests drive, with the same handler.
        return await hot_heartbeat(state, off_loop, worker, credential)

    @app.post("/v1/workers/leave")
    def leave(credential: Credential = "", worker: str = Query(min_length=1, max_length=256)) -> msg.OkReply:
        with state.acting_as(worker, credential):
            state.leave(worker)
        return msg.OkReply()

    @app.post("/v1/publish")
    def publish(req: msg.Publish, credential: Credential = "") -> msg.OkReply:
        # Who may publish this, first and cheaply; then validation and the chunk map, before the lock, never
        # under it (they may cost seconds of CPU at the piece limit); publish checks all again under the lock.
        state.authorize_publish(req, credential)
        prepared = state.prepare(req)
        with state.acting_as(req.worker, credential):
            state.publish(req, prepared)
        return msg.OkReply()

    @app.post("/v1/unpublish")
    def unpublish(req: msg.Unpublish, credential: Credential = "") -> msg.UnpublishAck:
        with state.acting_as(req.worker, credential):
            return state.unpublish(req)

    @app.post("/v1/delta/report")
    def delta_report(req: msg.DeltaReport, credential: Credential = "") -> msg.DeltaReportAck:
        with state.acting_as(req.worker, credential):
            return state.report_bad_delta(req)

    @app.post(msg.FLIP_REPORT_PATH)
    def flip_report(req: msg.FlipReport, credential: Credential = "") -> msg.FlipReply:
        with state.acting_as(req.worker, credential):
            return state.flip_report(req)

    @app.post("/v1/preserve")
    def preserve(req: msg.PreserveQuery) -> msg.PreserveAnswer:
        return state.must_preserve(req)

    # /v1/fetch/begin and /v1/fetch/exchange, most of a hub's requests, are answered before FastAPI
    # (``fetch_routes.FetchRoutes``), their state calls on the state threads. /v1/fetch/end stays here, in
    # Starlette's pool: it drains the reads peers still make of a holding it gives up, which may take seconds.
    @app.post("/v1/fetch/end")
    def end(req: msg.EndFetch, credential: Credential = "") -> msg.EndFetchAck:
        with state.acting_as(req.worker, credential):
            return state.end_fetch(req)

    # A manifest is the largest reply most readers get (a digest per chunk and per block): gzipped for clients
    # that accept it (``fetch_routes.GZIP_MIN_BYTES``).
    @app.get("/v1/manifest", response_model=msg.ManifestMsg)
    async def manifest(request: Request, model: str = Query(min_length=1, max_length=256),
                       version: str = Query("latest", max_length=40),
                       layout: str = Query("hf", min_length=1, max_length=256)) -> Response:
        reply = manifest_to_msg(await off_loop(state.manifest, model, _version_arg(version), layout))
        return _json_reply(reply.model_dump_json().encode(), request.headers.get("accept-encoding", ""))

    @app.get("/v1/versions")
    def versions(model: str = Query(min_length=1, max_length=256),
                 layout: str | None = Query(None, max_length=256)) -> msg.VersionsReply:
        return msg.VersionsReply(model=model, versions=state.versions(model, layout))

    @app.get("/v1/wait")
    async def wait(model: str = Query(min_length=1, max_length=256), newer_than: int = Query(-1, ge=-1, le=2**62),
                   layout: str = Query("hf", max_length=256), timeout: float = Query(5.0, ge=0, le=30)) -> msg.WaitReply:
        # A long-poll parks on the event loop and holds no thread: a thousand idle followers cost no threads. It
        # wakes on a change of this model's holdings, and reads the versions again (on a state thread) only when
        # the model's change count moved (an int read, no lock).
        deadline = time.monotonic() + timeout
        looked_at = None
        while True:
            seen = state.changes.seq
            if state.model_seq.get(model, 0) != looked_at:
                looked_at = state.model_seq.get(model, 0)
                newest = max(await off_loop(state.versions, model, layout), default=None)
                if newest is not None and newest > newer_than:
                    return msg.WaitReply(version=newest)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or state.changes.closed:  # timed out, or the hub is stopping
                return msg.WaitReply(version=None)
            await state.changes.wait_async(seen, remaining, model)

    @app.get("/v1/status")
    def status() -> msg.StatusReply:
        return state.status()

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    fetch = FetchRoutes(app, state, _STATUS_OF, off_loop)
    return _TokenGate(_BodyLimit(_StampInstance(fetch, state.instance), max_body_bytes), token, state.instance)


def _advertised_address_problem(req: msg.RegisterWorker, registered_from: str | None) -> str | None:
    """A TCP-plane worker may advertise only its own address (``tcp_wire.advertised_host_problem``)."""
    if len(req.agent_metadata_b64) > 8192:  # far larger than any TCP metadata: another plane's
        return None
    return advertised_host_problem(base64.b64decode(req.agent_metadata_b64), registered_from)


def _json_reply(body: bytes, accept_encoding: str) -> Response:
    """JSON bytes as a reply, gzipped where ``fetch_routes.gzipped`` says."""
    packed = gzipped(body, accept_encoding)
    if packed is not None:
        return Response(packed, media_type="application/json", headers={"content-encoding": "gzip"})
    return Response(body, media_type="application/json")


def _version_arg(version: str) -> int | str:
    """'latest' or plain decimal digits (no sign, spaces, '1.0' or '1e3')."""
    if version == "latest":
        return version
    if not (version.isascii() and version.isdigit() and len(version) <= 19) or int(version) > 2**62:
        raise errors.InvalidRequest(f"version must be an integer in [0, 2**62] or 'latest', got {version[:40]!r}")
    return int(version)
