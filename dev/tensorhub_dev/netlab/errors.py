"""Errors of the network lab."""

from __future__ import annotations

from tensorhub_verl.errors import TensorHubError


class NetlabError(TensorHubError):
    """Building, running in or tearing down an emulated lab failed; the message names the command."""


class NetlabUnavailable(NetlabError):
    """This machine cannot build namespaces (not root, no iproute2, or no tc); tests skip on this."""


__all__ = ["NetlabError", "NetlabUnavailable"]
