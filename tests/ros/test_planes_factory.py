"""The data plane factory (planes/factory.py) and the planes' nested configs (planes/config.py): names, flat
settings, checks."""

import pytest

from tensorhub_verl import errors
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.planes import factory
from tensorhub_verl.ros.planes.base import DataPlane
from tensorhub_verl.ros.planes.config import PlaneConfig


def test_a_duplicate_or_unknown_plane_name_raises():
    with pytest.raises(errors.ConfigError, match="already registered"):
        factory.register_plane("tcp", "somewhere.else", "Plane")
    with pytest.raises(errors.ConfigError, match="already registered"):
        factory.register_plane("auto", "somewhere.else", "Plane")
    with pytest.raises(errors.ConfigError, match=r"one of \('auto', 'nixl', 'tcp'\)"):
        PlaneConfig(kind="rdma")


def test_flat_settings_land_in_their_planes_config():
    config = ClientConfig.from_fields(window=2, transport="tcp", tcp_streams=3, tcp_host="10.0.0.5",
                                      preconnect_peers=0, progress="pump", net_devices="eth1")
    assert config.fetch.window == 2 and config.plane.kind == "tcp"
    assert (config.plane.tcp.streams, config.plane.tcp.host, config.plane.tcp.preconnect_peers) == (3, "10.0.0.5", 0)
    assert (config.plane.nixl.progress, config.plane.nixl.net_devices) == ("pump", "eth1")
    nested = ClientConfig.from_fields(plane={"kind": "tcp", "tcp": {"streams": 5}})
    assert nested.plane.tcp.streams == 5 and nested.plane.nixl == PlaneConfig().nixl
    for bad in ({"transport": "udp"}, {"tcp_streams": 0}, {"progress": "spin"}, {"preconnect_peers": 17},
                {"plane": {"kind": "tcp", "tcp": {"port": 1}}}):
        with pytest.raises(errors.ConfigError):
            ClientConfig.from_fields(**bad)
    with pytest.raises(errors.ConfigError, match="PlaneConfig"):
        ClientConfig(plane={"kind": "tcp"})


def test_the_registry_creates_the_plane_it_names():
    plane = factory.create(PlaneConfig(kind="tcp"), "reg-worker", "http://127.0.0.1:1", io_timeout_s=5.0)
    try:
        assert isinstance(plane, DataPlane) and plane.name == "tcp" and plane.agent_name.startswith("reg-worker-")
        assert plane.preconnect_peers == PlaneConfig().tcp.preconnect_peers
    finally:
        plane.close()
