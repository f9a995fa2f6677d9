"""Fast checks of ``tensorhub attach-vllm``'s argument handling and of ``scripts/attach_vllm_node.sh``
(no engine is started: the launcher runs against a stand-in ``tensorhub`` that prints its arguments)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tensorhub_verl import errors
from tensorhub_verl.vllm.attach import build_parser, location_labels
from tests.requires import require

LAUNCHER = Path(__file__).resolve().parents[2] / "scripts" / "attach_vllm_node.sh"


def test_location_labels():
    assert location_labels("dc=dc1, rack=r2 ,node=n3") == {"dc": "dc1", "rack": "r2", "node": "n3"}
    assert location_labels(None) is None
    for bad in ("dc", "dc=", "=x", "color=red"):
        with pytest.raises(errors.ConfigError):
            location_labels(bad)


def test_hub_and_token_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("TENSORHUB_HUB", "http://h:7")
    monkeypatch.setenv("TENSORHUB_TOKEN", "s3cret")
    ns = build_parser().parse_args(["--model-dir", "m"])
    assert (ns.hub, ns.token, ns.model, ns.port) == ("http://h:7", "s3cret", "policy", 8000)
    ns = build_parser().parse_args(["--model-dir", "m", "--hub", "http://x:1", "--", "--seed", "3"])
    assert ns.hub == "http://x:1" and ns.vllm_args == ["--", "--seed", "3"]


def test_the_maximum_length_is_the_models_unless_given():
    """vLLM refuses a --max-model-len above the model's own (a 512-token model failed at start-up with the
    old fixed 2048): by default the flag is not passed and vLLM derives it from the model's config."""
    require("vllm")
    from tensorhub_verl.vllm.attach import vllm_argv

    argv = vllm_argv(build_parser().parse_args(["--model-dir", "m", "--hub", "http://h:1"]))
    assert "--max-model-len" not in argv
    argv = vllm_argv(build_parser().parse_args(["--model-dir", "m", "--hub", "http://h:1", "--max-model-len", "300"]))
    assert argv[argv.index("--max-model-len") + 1] == "300"


def test_graphs_are_turned_off_on_the_cpu_build_only(monkeypatch):
    """vLLM's CPU build runs eager in float32; on a GPU vLLM's defaults stand (CUDA graphs, the model's dtype)
    unless the user passes --enforce-eager after --."""
    require("vllm")
    from tensorhub_verl.vllm import compat
    from tensorhub_verl.vllm.attach import vllm_argv

    args = ["--model-dir", "m", "--hub", "http://h:1"]
    monkeypatch.setattr(compat, "is_cpu_platform", lambda: True)
    argv = vllm_argv(build_parser().parse_args(args))
    assert "--enforce-eager" in argv and argv[argv.index("--dtype") + 1] == "float32"
    monkeypatch.setattr(compat, "is_cpu_platform", lambda: False)
    argv = vllm_argv(build_parser().parse_args(args))
    assert "--enforce-eager" not in argv and "--dtype" not in argv
    assert "--enforce-eager" in vllm_argv(build_parser().parse_args(args + ["--", "--enforce-eager"]))


def _run_launcher(tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin" / "tensorhub"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TENSORHUB_")}
    base["PATH"] = f"{fake.parent}:{base.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(["bash", str(LAUNCHER), *args], env=base | env, capture_output=True, text=True, check=False,
                          timeout=30)


def test_launcher_builds_location_from_env(tmp_path):
    r = _run_launcher(tmp_path, ["--model-dir", "m", "--", "--seed", "1"],
                      {"TENSORHUB_HUB": "http://h:1", "TENSORHUB_DC": "dc1", "TENSORHUB_RACK": "r2",
                       "TENSORHUB_NODE": "n3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:-1] == ["attach-vllm", "--location", "dc=dc1,rack=r2,node=n3", "--model-dir", "m",
                                         "--", "--seed", "1"]
    # an explicit --location wins over the environment
    r = _run_launcher(tmp_path, ["--location", "dc=x,node=y", "--model-dir", "m"],
                      {"TENSORHUB_HUB": "http://h:1", "TENSORHUB_DC": "dc1"})
    assert r.stdout.split("\n")[:-1] == ["attach-vllm", "--location", "dc=x,node=y", "--model-dir", "m"]


def test_launcher_needs_a_hub(tmp_path):
    r = _run_launcher(tmp_path, ["--model-dir", "m"], {})
    assert r.returncode == 2 and "TENSORHUB_HUB" in r.stderr and r.stdout == ""
    assert _run_launcher(tmp_path, ["--hub", "http://h:1", "--model-dir", "m"], {}).returncode == 0


def test_a_configuration_vllm_refuses_ends_with_the_reason_and_the_fix(tiny_models):
    """The tiny models' maximum is 512 tokens: asking for 4096 is refused by vLLM's own validation."""
    import sys

    proc = subprocess.run([sys.executable, "-m", "tensorhub_verl.cli", "attach-vllm", "--hub", "http://127.0.0.1:9",
                           "--model-dir", tiny_models["qwen2"], "--port", "18555", "--max-model-len", "4096"],
                          capture_output=True, text=True, timeout=240, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "vLLM refused its configuration" in proc.stderr and "max_model_len" in proc.stderr
    assert "fix:" in proc.stderr and "Traceback" not in proc.stderr
