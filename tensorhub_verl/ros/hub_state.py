"""The hub's soft state: re-exported from ``tensorhub_verl.ros.hub`` (the facade and its parts live there)."""

from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.records import GroupKey, Holding, Key, Member, VersionRecord, WorkerRecord
from tensorhub_verl.ros.hub.state import HubState

__all__ = ["GroupKey", "Holding", "HubConfig", "HubState", "Key", "Member", "VersionRecord", "WorkerRecord"]
