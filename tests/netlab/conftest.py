"""Shared fixtures for the network-lab tests: skip with the reason when namespaces cannot be built."""

from __future__ import annotations

import pytest

from tensorhub_dev.netlab import NetlabUnavailable, check_available, ip_netns_names
from tensorhub_dev.netlab.iproute import ip


@pytest.fixture
def netns_ok() -> None:
    try:
        check_available()
    except NetlabUnavailable as e:
        pytest.skip(f"network lab unavailable: {e}")


@pytest.fixture
def no_leftovers(netns_ok):
    """Assert that a test leaves none of its own lab namespaces behind."""
    before = set(ip_netns_names())
    yield
    leaked = {ns for ns in set(ip_netns_names()) - before if ns.startswith("thl-")}
    for ns in leaked:  # remove only what this test leaked, never another run's lab
        ip("netns", "del", ns, check=False)
    assert not leaked, f"lab namespaces leaked: {sorted(leaked)}"
