"""``vllm serve``'s argument functions from either home: ``vllm.entrypoints.launchers.cli_args`` (vLLM 0.31, installed
here) or ``vllm.entrypoints.common.cli_args`` (0.33 moved ``make_arg_parser`` there; stood in for by a module put
in ``sys.modules``, since no 0.33 build installs here)."""

from __future__ import annotations

import types

import pytest

from tensorhub_verl.errors import ConfigError
from tests.requires import require

require("vllm")

from tensorhub_verl.vllm import compat  # noqa: E402

pytestmark = pytest.mark.vllm


def test_the_installed_vllm_has_them_in_its_launchers_module():
    import vllm.entrypoints.launchers.cli_args as old

    assert compat.serve_cli_functions() == (old.make_arg_parser, old.validate_parsed_serve_args)
    args = compat.openai_server_args(["--model", "some/model", "--port", "8123"])
    assert args.port == 8123


def test_the_newer_home_is_preferred_name_by_name(monkeypatch):
    import vllm.entrypoints.launchers.cli_args as old

    def make_arg_parser(parser):
        return parser

    moved = types.ModuleType("vllm.entrypoints.common.cli_args")
    moved.make_arg_parser = make_arg_parser  # only this one moved: the other still comes from the old module
    monkeypatch.setitem(__import__("sys").modules, "vllm.entrypoints.common.cli_args", moved)
    assert compat.serve_cli_functions() == (make_arg_parser, old.validate_parsed_serve_args)


def test_a_vllm_without_them_is_named_with_the_supported_releases():
    with pytest.raises(ConfigError, match=r"has no make_arg_parser, validate_parsed_serve_args .*supports vLLM "
                                          r">=0\.31,<0\.34"):
        compat.serve_cli_functions(("vllm.no_such_module", "vllm.entrypoints"))
