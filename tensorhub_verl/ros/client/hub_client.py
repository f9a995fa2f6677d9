"""HTTP calls to the hub: typed requests and replies, retries with backoff, typed errors.

Notices when the hub it talks to is a new instance (a restart) and lets the owner re-register its
soft state before the call is repeated.

Keeps the worker credential that registration returns and sends it with every call, so callers never
see it. A call that raced a re-registration (sent with the credential it replaced, or answered before the
re-registration's reply with the new credential arrived) is repeated once, after that re-registration.

Never sends the hub token or a job key in clear to another host: either with an ``http://`` URL is refused
unless the hub is on loopback or the caller says the network is trusted (``allow_plain_http``). Never sends
either, nor a credential, to a peer that has not proven it holds the token (``proven_pool``, ``hub_proof``).
"""

from __future__ import annotations

import json
import logging
import ipaddress
import ssl
import threading
import time
from typing import Callable, TypeVar
from urllib.parse import urlencode, urlsplit

import urllib3
from pydantic import BaseModel, ValidationError

from tensorhub_verl import errors
from tensorhub_verl.errors import UnknownFetch, UnknownWorker
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER, INSTANCE_HEADER, JOB_KEY_HEADER, REGISTER_PATH
from tensorhub_verl.ros.client.proven_pool import NotProven, proven_pool
from tensorhub_verl.ros.client.retry import Backoff

logger = logging.getLogger("tensorhub_verl.ros.client")

R = TypeVar("R", bound=BaseModel)

_ERRORS: dict[str, type[errors.TensorHubError]] = {
    "VersionNotFound": errors.VersionNotFound,
    "ManifestMismatch": errors.ManifestMismatch,
    "Unauthorized": errors.Unauthorized,
    "NotOwner": errors.NotOwner,
    "NotModelOwner": errors.NotModelOwner,
    "JobKeyRequired": errors.JobKeyRequired,
    "InvalidRequest": errors.InvalidRequest,
    "PlaneMismatch": errors.PlaneMismatch,
    "OverBudget": errors.OverBudget,
    "DeltaRefused": errors.DeltaRefused,
    "DeltaWithheld": errors.DeltaWithheld,
    "UnknownWorker": UnknownWorker,
    "UnknownFetch": UnknownFetch,
}


class HubClient:
    def __init__(self, url: str, token: str | None = None, request_timeout_s: float = 15.0,
                 retry_s: float = 30.0, on_new_instance: Callable[[], None] | None = None,
                 ca_file: str | None = None, allow_plain_http: bool = False, job_key: str | None = None):
        """``ca_file``: PEM file of the CA that signed an https hub's certificate (default: the system's).
        ``allow_plain_http``: send ``token`` over ``http://`` to a hub on another host (a network where nobody
        can read or relay the traffic); otherwise such a URL is refused before anything is sent.
        ``job_key``: sent with registrations only, the secret of the worker's job (``ownership.py``)."""
        if not url.startswith(("http://", "https://")):
            raise errors.ConfigError(f"hub URL {url!r} must start with http:// or https://")
        if token and url.startswith("http://") and not allow_plain_http and not is_loopback_url(url):
            raise errors.ConfigError(
                f"refusing to send the hub token in clear to {url}: anyone on the path could read it and act as "
                f"any worker. Serve the hub over TLS (tensorhub hub --tls-cert/--tls-key, an https:// URL and, for "
                f"a private CA, tls_ca_file / --ca-file), or, on a network you trust, allow plain HTTP "
                f"(ClientConfig.allow_plain_http, tensorhub.allow_plain_http, --allow-plain-http)")
        if job_key and url.startswith("http://") and not allow_plain_http and not is_loopback_url(url):
            raise errors.ConfigError(
                f"refusing to send the job key in clear to {url}: anyone on the path could read it and join the "
                f"job (its NIXL memory, its models). Serve the hub over TLS (an https:// URL), or, on a network "
                f"you trust, allow plain HTTP (ClientConfig.allow_plain_http, --allow-plain-http)")
        if ca_file is not None and not url.startswith("https://"):
            raise errors.ConfigError(f"a CA file was given but the hub URL {url!r} is not https://")
        try:
            tls = {"ssl_context": ssl.create_default_context(cafile=ca_file)} if ca_file else {}
        except (OSError, ssl.SSLError) as e:
            raise errors.ConfigError(f"cannot load CA file {ca_file}: {e}") from e
        self.url = url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        # gzip: the hub compresses its large replies (manifests) for clients that accept it (urllib3 inflates them).
        self._headers = {"accept-encoding": "gzip"} | ({"Authorization": f"Bearer {token}"} if token else {})
        self._job_key = job_key
        # urllib3 rather than httpx: it costs less CPU per request (docs/benchmarks.md), and a fetch makes one
        # request per exchange. Its connections set TCP_NODELAY (without it a request's header and body writes
        # meet delayed ACKs on every call). One pooled connection per concurrent caller (the
        # fetch loop, its exchanges, the heartbeat); retries are this class's own (below), not urllib3's.
        # Every new connection proves the hub before it carries the token, the job key or the credential.
        self._http = proven_pool(self.url, token, maxsize=8, block=False, retries=False,
                                 timeout=request_timeout_s, **tls)
        self._retry_s = retry_s
        self._on_new_instance = on_new_instance
        self._instance: str | None = None
        self._restarted_at: float | None = None
        self._recovering = threading.Lock()
        self._recovering_thread: int | None = None
        self._recoveries = 0
        """Completed re-registrations; a caller that waited on another thread's recovery sees it change."""
        self._credential = ""
        """This worker's secret, from its last registration (a restarted hub issues a new one)."""

    def shorten_retries(self, seconds: float) -> None:
        """For goodbyes: a client that is closing should not wait long for a hub that is gone."""
        self._retry_s = min(self._retry_s, seconds)

    def post(self, path: str, body: BaseModel | None = None, reply: type[R] | None = None,
             params: dict | None = None, timeout: float | None = None):
        return self._call("POST", path, body, reply, params, timeout)

    def get(self, path: str, reply: type[R] | None = None, params: dict | None = None,
            timeout: float | None = None):
        return self._call("GET", path, None, reply, params, timeout)

    # ------------------------------------------------------------ queries: no worker identity needed
    def plane(self) -> str:
        """The data plane every worker of this hub uses (``planes/one_plane.py``)."""
        return self.get(msg.HUB_INFO_PATH, msg.HubInfo).plane

    def versions(self, model: str, layout: str | None = None) -> dict[int, list[str]]:
        """The versions of ``model`` that some holder has (in ``layout``; None: in any layout) -> holders."""
        params = {"model": model} | ({"layout": layout} if layout else {})
        reply = self.get("/v1/versions", msg.VersionsReply, params=params)
        return {int(v): holders for v, holders in reply.versions.items()}

    def wait(self, model: str, newer_than: int | None, layout: str, timeout: float) -> int | None:
        """One long poll: the newest ``layout`` version newer than ``newer_than`` (any, if None), or None when
        none appeared within ``timeout`` s (at most 30: the hub's cap). The reply may take the request
        timeout on top."""
        reply = self.get("/v1/wait", msg.WaitReply, params={
            "model": model, "newer_than": -1 if newer_than is None else newer_than, "layout": layout,
            "timeout": timeout}, timeout=timeout + self.request_timeout_s)
        return reply.version

    def _call(self, method: str, path: str, body, reply, params, timeout):
        for attempt in range(2):
            sent_with = self._credential
            try:
                data = self._send(method, path, body, params, timeout)
                break
            except UnknownWorker:
                if attempt == 1 or not self._recover():
                    raise
            except errors.NotOwner:
                # Sent just before a re-registration replaced the credential, or answered while the reply that
                # carries the new one is still on its way: repeat it once that re-registration has landed.
                if attempt == 1 or not self._await_recovery(sent_with):
                    raise
        if reply is None:
            return json.loads(data)
        try:
            return reply.model_validate_json(data)  # straight from the bytes: no dict in between
        except ValidationError as e:
            raise errors.InvalidRequest(f"hub {self.url} answered {path} with a body that is not a "
                                        f"{reply.__name__} (is the hub another version?): {e}") from e

    def _send(self, method: str, path: str, body, params, timeout):
        backoff = Backoff(deadline=time.monotonic() + self._retry_s)
        content = body.model_dump_json().encode() if body is not None else None
        while True:
            try:
                headers = dict(self._headers)
                if content is not None:
                    headers["content-type"] = "application/json"
                if self._credential:
                    headers[CREDENTIAL_HEADER] = self._credential
                if self._job_key and path == REGISTER_PATH:
                    headers[JOB_KEY_HEADER] = self._job_key
                response = self._http.urlopen(
                    method, f"{path}?{urlencode(params)}" if params else path, body=content, headers=headers,
                    timeout=timeout if timeout is not None else self.request_timeout_s)
            except urllib3.exceptions.HTTPError as e:
                if _tls_refused(e):  # a certificate that fails verification will not pass on a retry
                    raise errors.HubUnavailable(f"hub {self.url}: TLS verification failed ({e}); pass the CA "
                                                f"that signed the hub's certificate (tls_ca_file)") from e
                if not backoff.fits():
                    if isinstance(e, NotProven):
                        raise errors.HubNotProven(f"{e}; waited {self._retry_s:.0f} s for the real hub") from e
                    raise errors.HubUnavailable(f"hub {self.url} unreachable for {self._retry_s:.0f} s "
                                                f"({type(e).__name__}: {e}); is `tensorhub hub` running?") from e
                backoff.sleep(jitter=0.25)
                continue
            if response.status in (502, 503, 504) and backoff.fits():
                backoff.sleep()
                continue
            if response.status >= 400:
                self._check_instance(response.headers.get(INSTANCE_HEADER))
                raise _error_of(response.status, response.data)
            if path == REGISTER_PATH:
                # Kept before looking at the instance: when this reply is the first from a restarted hub, the
                # re-registration that follows must present the credential that hub just issued (else the
                # hub holds one this client never kept, and refuses it until the id times out).
                self._credential = _credential_in(response.data) or self._credential
            self._check_instance(response.headers.get(INSTANCE_HEADER))
            return response.data

    def _check_instance(self, instance: str | None) -> None:
        if instance is None or instance == self._instance:
            return
        first = self._instance is None
        self._instance = instance
        if not first:
            self._restarted_at = time.monotonic()
            logger.warning("hub %s restarted (instance %s); re-registering", self.url, instance)
            self._recover()

    def _recover(self) -> bool:
        """Re-registers soft state once per restart; returns False when nothing could be done.

        A call that meets UnknownWorker while another thread is re-registering (the heartbeat thread
        usually notices a restart first) waits for that recovery and then retries, instead of failing.
        """
        if self._on_new_instance is None or self._recovering_thread == threading.get_ident():
            return False  # nothing to do, or a call made by the recovery itself
        seen = self._recoveries
        if not self._recovering.acquire(timeout=self._retry_s):
            return False
        try:
            if self._recoveries != seen:
                return True  # another thread re-registered while this one waited
            self._recovering_thread = threading.get_ident()
            self._on_new_instance()
            self._recoveries += 1
            return True
        finally:
            self._recovering_thread = None
            self._recovering.release()

    def _await_recovery(self, sent_with: str) -> bool:
        """After a NotOwner reply to a call sent with credential ``sent_with``: True once this client holds
        another credential (a re-registration landed, now or while waiting up to ``retry_s`` for one under
        way), False when no re-registration is under way and the credential is unchanged (a real refusal)."""
        if self._credential != sent_with:
            return True
        if self._recovering_thread in (None, threading.get_ident()):
            return False
        if self._recovering.acquire(timeout=self._retry_s):
            self._recovering.release()
        return self._credential != sent_with

    def since_restart(self) -> float | None:
        """Seconds since this client last saw the hub come back as a new instance (None: never)."""
        return None if self._restarted_at is None else time.monotonic() - self._restarted_at

    def close(self) -> None:
        self._http.close()


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is this machine's loopback (``localhost``, 127.0.0.0/8, ``::1``)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _credential_in(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    credential = data.get("credential") if isinstance(data, dict) else None
    return credential if isinstance(credential, str) else ""


def _tls_refused(error: Exception) -> bool:
    cause = error
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        cause = cause.__cause__ or cause.__context__
    return "CERTIFICATE_VERIFY_FAILED" in str(error)


def _error_of(status: int, content: bytes) -> errors.TensorHubError:
    """The typed error for an HTTP error reply of ``status`` whose body is ``content``."""
    try:
        body = msg.ErrorReply.model_validate_json(content)
    except ValidationError:  # not the hub's error body (a proxy's page, a framework's default reply)
        body = msg.ErrorReply(detail=content[:500].decode(errors="replace"))
    if status == 401:
        return errors.Unauthorized(body.detail)
    cls = _ERRORS.get(body.error, errors.InvalidRequest)
    if cls is errors.ManifestMismatch:
        return errors.ManifestMismatch(body.detail, tensor=body.tensor)
    return cls(f"{body.detail} (HTTP {status})" if cls is errors.InvalidRequest else body.detail)


def hub_plane_for(config, hub_url: str, token: str | None) -> str | None:
    """The plane a client with ``config`` (a ``ClientConfig``) creates for the hub at ``hub_url``: the hub's, asked
    once, when the config leaves the plane on 'auto'; None when the config names one."""
    if config.plane.kind != "auto":
        return None
    access = config.hub
    hub = HubClient(hub_url, token, config.timeouts.request_timeout_s, config.timeouts.hub_retry_s,
                    ca_file=access.tls_ca_file, allow_plain_http=access.allow_plain_http, job_key=access.job_key)
    try:
        return hub.plane()
    finally:
        hub.close()
