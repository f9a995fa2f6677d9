"""A wheel (non-editable) install carries the Hydra configs, and the search-path plugin finds them there; it
carries the product only (no developer tool of dev/), and then ``tensorhub demo`` says how to get the tools.

The wheel is built offline from a copy of the sources (no build isolation, no index) and "installed" by
unzipping it: a wheel is a zip laid out as site-packages. The check runs in a fresh interpreter that imports
the package from that directory only, never from this checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.requires import require

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ["tensorhub_verl/conf/tensorhub/cross_dc.yaml", "tensorhub_verl/conf/tensorhub/elastic.yaml",
           "tensorhub_verl/conf/tensorhub/standalone.yaml"]
CPU_PRESETS = ["tiny_grpo", "tiny_grpo_fully_async", "tiny_ppo"]
"""The CPU harness's Hydra presets (``+tensorhub_cpu=<name>``): developer tools, in dev/ and not in the wheel."""

LOOKUP = textwrap.dedent("""
    import json
    import tensorhub_verl
    from hydra.core.config_search_path import ConfigSearchPath
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra_plugins.tensorhub_verl_searchpath import TensorHubSearchPathPlugin
    from tensorhub_verl.verl.hydra_searchpath import conf_dir
    search_path = ConfigSearchPathImpl()
    TensorHubSearchPathPlugin().manipulate_search_path(search_path)
    print(json.dumps({"package": tensorhub_verl.__file__, "conf": str(conf_dir()),
                      "search_path": [e.path for e in search_path.get_path()]}))
""")


@pytest.mark.timeout(180)
def test_wheel_ships_the_hydra_configs_and_the_plugin_finds_them(tmp_path):
    require("hydra")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("tensorhub_verl", "hydra_plugins", "dev"):  # dev/ as in a checkout: the wheel must leave it out
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(tmp_path / "dist"), "."], cwd=src, capture_output=True, text=True,
                           timeout=150)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("tensorhub_verl-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(site)
    assert set(CONFIGS) <= names and "hydra_plugins/tensorhub_verl_searchpath/__init__.py" in names
    # The product only: no developer tool (dev/'s tensorhub_dev, the lab, the simulator, the demo, test helpers).
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tensorhub_verl", "hydra_plugins"}, sorted(tops)
    assert not [n for n in names if n.split("/")[1:2] in (["netlab"], ["sim"], ["demo"], ["testing"])]
    assert not [n for n in names if "tensorhub_cpu" in n], "the CPU presets belong to dev/, not the wheel"

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", LOOKUP], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    conf = site / "tensorhub_verl" / "conf"
    assert found["package"] == str(site / "tensorhub_verl" / "__init__.py")
    assert found["conf"] == str(conf) and f"file://{conf}" in found["search_path"]

    # Without the developer tools, `tensorhub demo` says where it lives and how to install it. The test set-up
    # installs dev/ into this interpreter (editable), so the child blocks its import as a wheel-only install lacks it.
    no_dev = ("import sys; sys.modules['tensorhub_dev'] = None; from tensorhub_verl.cli import main; "
              "sys.exit(main(['demo', '--steps', '1']))")
    demo = subprocess.run([sys.executable, "-c", no_dev], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert demo.returncode == 2 and "pip install -e dev/" in demo.stderr, demo.stderr[-2000:]


def test_the_checkout_finds_the_configs_too():
    require("hydra")
    from tensorhub_verl.verl.hydra_searchpath import conf_dir

    assert conf_dir() == REPO / "tensorhub_verl" / "conf"
    assert all((REPO / name).is_file() for name in CONFIGS)
    assert (REPO / "conf" / "tensorhub" / "standalone.yaml").is_file()  # the old path still works (a link)


CPU_LOOKUP = textwrap.dedent("""
    import json
    from hydra import compose, initialize
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin
    names = sorted(f"{p.__module__}.{p.__name__}" for p in Plugins.instance().discover(SearchPathPlugin))
    with initialize(config_path=None, version_base=None):  # no primary config: the plugins' search path only
        cfg = compose(overrides=["+tensorhub_cpu=tiny_grpo"])
    print(json.dumps({"plugins": names, "device": cfg.trainer.device, "dtype": cfg.actor_rollout_ref.rollout.dtype}))
""")


@pytest.mark.timeout(120)
def test_the_cpu_presets_live_in_dev_and_its_plugin_finds_them():
    """The CPU presets are dev/'s (the CPU harness), not the product's; with dev/ importable (installed, or on the
    path as the tests have it), its Hydra plugin puts them on Hydra's search path: ``+tensorhub_cpu=tiny_grpo``
    composes with no hydra.searchpath override. (The demo job's full composition with verl's config:
    tests/verl/test_cpu_platform_on_cpu.py::test_the_demo_job_composes_into_a_config_the_checks_accept.)"""
    require("hydra")
    from tensorhub_dev.verl_cpu.hydra_searchpath import PRESET_GROUP, conf_dir

    assert conf_dir() == REPO / "dev" / "tensorhub_dev" / "verl_cpu" / "conf"
    assert sorted(p.stem for p in (conf_dir() / PRESET_GROUP).glob("*.yaml")) == CPU_PRESETS
    assert not (REPO / "tensorhub_verl" / "conf" / PRESET_GROUP).exists()
    # A fresh interpreter: Hydra discovers plugins once per process.
    out = subprocess.run([sys.executable, "-c", CPU_LOOKUP], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert any(name.endswith(".CpuPresetsSearchPathPlugin") for name in found["plugins"]), found["plugins"]
    assert (found["device"], found["dtype"]) == ("cpu", "float32"), found
