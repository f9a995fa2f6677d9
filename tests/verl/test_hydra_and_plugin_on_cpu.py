"""The Hydra group composes with verl's ppo_trainer, and verl finds the backend in a fresh process.

Each check runs in a subprocess: Hydra's global state and verl's registry must start clean, as in a
real ``python -m verl.trainer.main_ppo`` launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)

COMPOSE = textwrap.dedent("""
    import json, sys
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from tensorhub_verl.verl.config import TensorHubVerlConfig
    for overrides in json.loads(sys.argv[1]):  # one list of overrides per config, each composed afresh
        with initialize_config_module("verl.trainer.config", version_base=None):
            cfg = compose("ppo_trainer", overrides=overrides)
        OmegaConf.resolve(cfg)  # as verl's TaskRunner.run does before building workers
        ce = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout.checkpoint_engine)
        th = TensorHubVerlConfig.from_mapping(ce.engine_kwargs["tensorhub"])
        print(json.dumps({"backend": ce.backend, "module": ce.custom_backend_module, "th": th.as_dict()}))
""")


def _run(code, *args, env=None, timeout=150):
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("TENSORHUB_TOKEN", None)
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _compose(*override_lists, env=None) -> list[dict]:
    """Each list of overrides composed into verl's ppo_trainer, in one fresh process (verl imports once)."""
    lines = _run(COMPOSE, json.dumps(override_lists), env=env).stdout.strip().splitlines()
    return [json.loads(line) for line in lines[-len(override_lists):]]


def test_standalone_and_cross_dc_compose_with_ppo_trainer():
    searchpath = f"hydra.searchpath=[file://{REPO}/conf]"  # the top-level link to tensorhub_verl/conf
    # TENSORHUB_DC in the shell: labels come from each Ray node (node_location), not from the shell of wherever
    # verl's task runner lands.
    standalone, float16, cross_dc = _compose(
        [searchpath, "+tensorhub=standalone", "tensorhub.keep_versions=4"],
        [searchpath, "+tensorhub=standalone", "actor_rollout_ref.rollout.dtype=float16"],
        [searchpath, "+tensorhub=cross_dc", "tensorhub.location.rack=r7"], env={"TENSORHUB_DC": "eu1"})
    out = standalone
    assert out["backend"] == "tensorhub" and out["module"] == "tensorhub_verl.verl.checkpoint_engine"
    assert out["th"]["keep_versions"] == 4 and out["th"]["staging"] == "cpu" and out["th"]["hub_address"] is None
    assert out["th"]["rollout_dtype"] == "bfloat16"  # verl's rollout.dtype default: the trainer casts to it

    assert float16["th"]["rollout_dtype"] == "float16"

    out = cross_dc
    assert out["th"]["location"] == {"rack": "r7"}
    assert out["th"]["hub_url_file"] == "auto" and out["th"]["hub_placement"] == "head"
    assert out["th"]["link_capacities"]["wan_gbps"] == 100.0 and out["th"]["seeds_per_dc"] is None


def test_one_override_with_the_search_path_plugin():
    """With the repository's own ``hydra_plugins/`` importable (as an install provides it), '+tensorhub=elastic'
    alone is enough: no hydra.searchpath override."""
    env = {"PYTHONPATH": str(REPO), "TENSORHUB_HUB_FILE": "/x/url"}
    found = _run("import hydra_plugins.tensorhub_verl_searchpath as m; print(m.__file__)", env=env)
    assert Path(found.stdout.strip().splitlines()[-1]) == REPO / "hydra_plugins" / "tensorhub_verl_searchpath" / \
        "__init__.py"
    [out] = _compose(["+tensorhub=elastic"], env=env)
    assert out["backend"] == "tensorhub" and out["th"]["keep_versions"] == 3
    assert out["th"]["hub_url_file"] == "/x/url" and out["th"]["min_replica_fraction"] == 0.5


def test_without_the_group_verl_stays_on_naive():
    out = _run(COMPOSE.replace('th = TensorHubVerlConfig.from_mapping(ce.engine_kwargs["tensorhub"])', "th = None")
               .replace('"th": th.as_dict()', '"th": None'), "[[]]")
    assert json.loads(out.stdout.strip().splitlines()[-1])["backend"] == "naive"


REGISTRY = textwrap.dedent("""
    import sys
    from verl.checkpoint_engine import CheckpointEngineRegistry, CheckpointEngineManager
    from verl.utils.import_utils import import_external_libs
    from tensorhub_verl.verl.patches.replace import is_replaced
    mode = sys.argv[1]
    if mode == "custom_backend_module":
        import_external_libs("tensorhub_verl.verl.checkpoint_engine")  # what verl's workers do
    try:
        cls = CheckpointEngineRegistry.get("tensorhub")
    except ValueError:
        print("NOT-REGISTERED"); sys.exit(0)
    print(cls.__module__, cls.__name__, is_replaced(CheckpointEngineManager, "update_weights"))
""")


def test_registered_through_custom_backend_module_in_a_fresh_process():
    proc = _run(REGISTRY, "custom_backend_module", env={"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert proc.stdout.split()[-3:] == ["tensorhub_verl.verl.checkpoint_engine", "TensorHubCheckpointEngine", "True"]
    assert "applied verl patch verl_0_9_1_manager_update_weights" in proc.stderr


def test_registered_through_the_verl_plugins_entry_point_in_a_fresh_process(tmp_path):
    """verl 0.9.1 loads the 'verl.plugins' entry-point group at 'import verl' (not 'verl.checkpoint_engine')."""
    dist = tmp_path / "tensorhub_verl_plugin_probe-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorhub-verl-plugin-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[verl.plugins]\ntensorhub = tensorhub_verl.verl.checkpoint_engine\n")
    proc = _run(REGISTRY, "entry_point", env={"PYTHONPATH": str(tmp_path), "VERL_USE_EXTERNAL_PLUGINS": "auto"})
    assert proc.stdout.split()[-2:] == ["TensorHubCheckpointEngine", "True"], proc.stdout


def test_not_registered_without_either_mechanism():
    proc = _run(REGISTRY, "none", env={"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert proc.stdout.strip().endswith("NOT-REGISTERED")


def test_the_config_dump_never_shows_the_token():
    """verl prints its resolved config; the token is read from the environment where it is used, not copied
    into the config (issue 22 point 13)."""
    secret = "the-hub-token-that-must-not-be-printed"
    code = COMPOSE.replace("print(json.dumps(", "print(OmegaConf.to_yaml(cfg)); print(th.resolved_token() == "
                           f"{secret!r}); print(json.dumps(")
    env = dict(os.environ, TENSORHUB_TOKEN=secret)
    overrides = [[f"hydra.searchpath=[file://{REPO}/conf]", "+tensorhub=standalone"]]
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(overrides)], capture_output=True, text=True,
                          timeout=150, env=env, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "token_env: TENSORHUB_TOKEN" in proc.stdout and lines[-2] == "True"  # the token is used ...
    assert secret not in proc.stdout + proc.stderr  # ... and never printed
