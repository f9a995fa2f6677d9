"""On a verl version the weight-moving patches were not written for, the backend refuses at once, naming the
supported version; on the installed (supported) verl it starts."""

from __future__ import annotations

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.verl import supported
from tests.requires import require


def test_the_supported_versions_are_the_weight_moving_patches_common_ones():
    assert supported.supported_verl_versions() == ("0.9.1",)


def test_another_verl_is_refused_naming_the_supported_one():
    with pytest.raises(ConfigError, match=r"supports verl 0\.9\.1; the installed verl is 0\.10\.0.*verl==0\.9\.1"):
        supported.require_supported_verl("0.10.0")
    supported.require_supported_verl("0.9.1")


def test_the_backend_refuses_to_start_on_another_verl(monkeypatch):
    require("verl")
    import verl

    from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

    supported.require_supported_verl()  # the installed verl is the supported one
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(ConfigError, match="supports verl 0.9.1"):
        TensorHubCheckpointEngine(is_master=True)
