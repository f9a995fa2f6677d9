"""A missing optional dependency fails the run unless a core-only install is being tested."""

from __future__ import annotations

import pytest

from tests.requires import CORE_ONLY_ENV, require

ABSENT = "tensorhub_no_such_module"


def test_a_missing_module_fails_a_full_install_run(monkeypatch):
    monkeypatch.delenv(CORE_ONLY_ENV, raising=False)
    with pytest.raises(ImportError):
        require(ABSENT)


def test_a_core_only_run_skips_instead(monkeypatch):
    monkeypatch.setenv(CORE_ONLY_ENV, "1")
    with pytest.raises(pytest.skip.Exception):
        require(ABSENT, reason="not installed")
    assert require("json").dumps([1]) == "[1]"  # a present module is imported either way
