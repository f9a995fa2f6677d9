"""An attacker from outside for the trust tests: raw hub requests (a real ``HubClient`` over real sockets) and,
where the attack needs one, a real TCP data plane serving whatever bytes the attacker registers."""

from __future__ import annotations

import base64

import torch

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.client.hub_client import HubClient
from tensorhub_verl.ros.planes.tcp import TcpPlane
from tensorhub_verl.ros.wire.convert import manifest_to_msg


class Outsider:
    """A worker that speaks the hub's API directly. ``served``: bytes its real TCP plane serves as if they were a
    version it holds (garbage, for a liar); None: it registers no data plane worth the name."""

    def __init__(self, hub_url: str, token: str | None, worker: str, job_key: str | None = None,
                 plane: str | None = "tcp", served: torch.Tensor | None = None, metadata: bytes | None = None,
                 allow_plain_http: bool = False):
        """``plane``: the plane it declares (None: the hub's)."""
        self.worker = worker
        self.hub = HubClient(hub_url, token, request_timeout_s=10, retry_s=2, job_key=job_key,
                             allow_plain_http=allow_plain_http)
        plane = plane or self.hub.plane()
        self.plane = TcpPlane(f"{worker}-agent", "127.0.0.1") if served is not None or plane == "tcp" else None
        self.served = served
        if served is not None:
            self.plane.register([served])
        grant_key = base64.b64encode(self.plane.grant_key).decode() if self.plane is not None else None
        agent_metadata = metadata if metadata is not None else self.plane.metadata() if self.plane else b"meta"
        self.ack = self.hub.post(msg.REGISTER_PATH, msg.RegisterWorker(
            worker=worker, location=msg.LocationMsg(), agent_name=f"{worker}-agent",
            agent_metadata_b64=base64.b64encode(agent_metadata).decode(), plane=plane,
            **({"grant_key_b64": grant_key} if grant_key else {})), msg.WorkerAck)

    def publish_copy(self, published) -> None:
        """Registers a copy of a visible version (``published``: its manifest) as a holding of this worker, as a
        reader re-registering what it fetched does: the hub takes it when its digests are the version's."""
        self.hub.post("/v1/publish", msg.Publish(
            worker=self.worker, holder=self.worker, manifest=manifest_to_msg(published),
            regions=[self.region()] * len(published.tensors)), msg.OkReply)

    def key(self, model="policy", version=1, layout="hf") -> dict:
        return {"worker": self.worker, "holder": self.worker, "model": model, "version": version, "layout": layout}

    def region(self) -> msg.RegionMsg:
        return msg.RegionMsg(addr=self.served.data_ptr() if self.served is not None else 1 << 20)

    def begin(self, digest: str, want: int = 0, have=(), **key) -> msg.ExchangeReply | None:
        return self.hub.post("/v1/fetch/begin", msg.BeginFetch(
            **self.key(**key), digest=digest, regions=[self.region()], have=list(have), want=want),
            msg.BeginFetchReply).first

    def report_corrupt(self, leases, **key) -> None:
        self.hub.post("/v1/fetch/exchange", msg.Exchange(**self.key(**key), want=0, failed=[
            msg.FailedRead(lease=lease, corrupt=True) for lease in leases]), msg.ExchangeReply)

    def end(self, ok: bool, hold: bool, **key) -> None:
        self.hub.post("/v1/fetch/end", msg.EndFetch(**self.key(**key), ok=ok, hold=hold), msg.EndFetchAck)

    def close(self) -> None:
        try:
            self.hub.post("/v1/workers/leave", params={"worker": self.worker}, reply=msg.OkReply)
        except Exception:  # the hub may be gone already; the plane is closed either way
            pass
        if self.plane is not None:
            self.plane.close()
        self.hub.close()
