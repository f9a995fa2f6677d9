"""What a worker exposes on the network: its data plane listens only on the configured devices."""

import ipaddress

from tests.ros.roles import exposed_holder


def test_a_worker_of_a_loopback_hub_listens_on_loopback_only(hub, roles):
    addresses = roles(exposed_holder, hub.url, "trainer").result(120)
    assert addresses, "expected UCX's TCP listener"
    assert all(ipaddress.ip_address(a).is_loopback for a in addresses), addresses
