"""ClientConfig: nested groups, the flat names callers and verl's config use, and errors that name the place."""

from __future__ import annotations

import pickle

import pytest

from tensorhub_verl import errors
from tensorhub_verl.ros.client.config import FLAT_NAMES, ClientConfig, FetchConfig, Timeouts
from tensorhub_verl.verl.config import TensorHubVerlConfig


def test_every_flat_name_lands_in_its_group():
    config = ClientConfig.from_fields(chunk_bytes=1 << 20, window=3, fetch_timeout_s=9.0, job_key="k", spot=True,
                                      transport="tcp", tcp_streams=2)
    assert config.publish.chunk_bytes == 1 << 20 and config.fetch.window == 3
    assert config.timeouts.fetch_timeout_s == 9.0 and (config.hub.job_key, config.hub.spot) == ("k", True)
    assert (config.plane.kind, config.plane.tcp.streams) == ("tcp", 2)
    # every field of every group is reachable flat, and no name is in two groups
    for name, group in FLAT_NAMES.items():
        assert hasattr(getattr(ClientConfig(), group), name)


def test_groups_may_come_whole_or_as_plain_data():
    config = ClientConfig.from_fields(fetch={"window": 5, "straggler_factor": 0}, timeouts=Timeouts(hub_retry_s=2),
                                      max_run_chunks=1)
    assert (config.fetch.window, config.fetch.straggler_factor, config.fetch.max_run_chunks) == (5, 0, 1)
    assert config.timeouts.hub_retry_s == 2 and config.timeouts.read_timeout_s == Timeouts().read_timeout_s
    assert ClientConfig(fetch=FetchConfig(window=2)).fetch.window == 2


def test_verl_settings_reach_the_client_through_from_fields():
    settings = TensorHubVerlConfig.from_mapping({"chunk_mb": 16, "window": 4, "transport": "tcp"}).client_settings()
    config = ClientConfig.from_fields(**settings)
    assert (config.publish.chunk_bytes, config.fetch.window, config.plane.kind) == (16 << 20, 4, "tcp")


def test_an_unknown_or_flat_name_fails_naming_its_place():
    with pytest.raises(errors.ConfigError, match=r"'windw'.*did you mean 'window', ClientConfig\.fetch\.window"):
        ClientConfig.from_fields(windw=4)
    with pytest.raises(errors.ConfigError, match=r"window is ClientConfig\.fetch\.window.*from_fields\(window="):
        ClientConfig(window=4)
    with pytest.raises(errors.ConfigError, match=r"tcp_streams is ClientConfig\.plane\.tcp\.streams"):
        ClientConfig(tcp_streams=4)
    with pytest.raises(errors.ConfigError, match="fetch must be a FetchConfig"):
        ClientConfig(fetch={"window": 4})
    with pytest.raises(errors.ConfigError, match="window must be >= 1"):
        ClientConfig.from_fields(window=0)
    with pytest.raises(errors.ConfigError, match="fetch_timeout_s must be > 0"):
        ClientConfig.from_fields(fetch_timeout_s=0)


def test_a_config_survives_pickling():
    config = ClientConfig.from_fields(window=7, transport="tcp")
    assert pickle.loads(pickle.dumps(config)) == config
