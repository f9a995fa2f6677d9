"""One data plane per hub: a reader can read only from holders on its own plane (NIXL metadata means nothing to
a TCP reader, and the reverse), so a hub whose workers mixed planes would have readers re-planning around every
holder of the other plane until their fetches failed. The hub therefore refuses, at registration, a worker whose
declared plane differs from its other live workers' planes."""

from __future__ import annotations

from typing import Mapping

from tensorhub_verl.errors import PlaneMismatch


def check_one_plane(worker: str, plane: str, others: Mapping[str, str]) -> None:
    """Raises PlaneMismatch when ``plane`` differs from a plane of ``others`` (the hub's other live workers:
    worker id -> its plane)."""
    differing = {other_plane: other for other, other_plane in others.items() if other_plane != plane}
    if not differing:
        return
    other_plane, example = sorted(differing.items())[0]
    raise PlaneMismatch(
        f"worker {worker!r} registers with the {plane!r} data plane, but this hub's other workers use "
        f"{other_plane!r} (e.g. {example!r}); all workers of one hub must use one plane. Set the same plane on "
        f"every worker: ClientConfig(plane=PlaneConfig(kind={other_plane!r})) or connect(..., "
        f"transport={other_plane!r}); in a verl job tensorhub.transport={other_plane}, and tensorhub attach-vllm "
        f"--transport {other_plane} (the default 'auto' picks per host: NIXL with RDMA or a loopback hub, "
        f"else TCP)", plane=plane, hub_plane=other_plane)
