"""``connect``: the one entry point of a worker. The hub URL says which client form it gets: one hub (``Client``),
the shards of a hub run as several processes (``ShardedClient``) or a hub process per region (``RegionalClient``).
Its own module, so that the forms import ``Client`` and nothing imports them back."""

from __future__ import annotations

from typing import Mapping

from tensorhub_verl import errors
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.client.regional_client import RegionalClient
from tensorhub_verl.ros.client.sharded_client import ShardedClient
from tensorhub_verl.ros.wire.topology import Location


def connect(hub_url: str, worker: str, location: Location | Mapping[str, str] | str | None = None,
            token: str | None = None, config: ClientConfig | None = None, **config_fields):
    """Connects a worker to the hub. Extra keyword arguments are ClientConfig fields (``ClientConfig.from_fields``:
    plane settings may be given flat, e.g. ``transport='tcp'``). A comma-separated list of URLs names the shards
    of a hub run as several processes (``tensorhub hub --shards K`` prints it): a ``ShardedClient``; a list of
    REGION=URL items names a hub process per region (``tensorhub hub --regions`` prints it): a ``RegionalClient``."""
    if config_fields:
        if config is not None:
            raise errors.ConfigError("pass either config= or ClientConfig fields, not both")
        config = ClientConfig.from_fields(**config_fields)
    if "=" in hub_url:  # "dc0/r0=URL,dc0/r1=URL": a hub process per region (wire/regions.py)
        return RegionalClient(hub_url, worker, location, token, config)
    if "," in hub_url:
        return ShardedClient([url.strip() for url in hub_url.split(",")], worker, location, token, config)
    return Client(hub_url, worker, location, token, config)
