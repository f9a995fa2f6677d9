"""The Hydra group composes with verl's ppo_trainer, and verl finds the backend in a fresh process.

Each check runs in a subprocess: Hydra's global state and verl's registry must start clean, as in a
real ``python -m verl.trainer.main_ppo`` launch. The module's checks run two at a time in the background
(``tests/fresh_processes.py``); each test asserts on its own processes' output.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fresh_processes import Check, fresh_processes

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)

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
        kwargs = ce.engine_kwargs or {}
        th = TensorHubVerlConfig.from_mapping(kwargs["tensorhub"]) if "tensorhub" in kwargs else None
        print(json.dumps({"backend": ce.backend, "module": ce.custom_backend_module,
                          "th": None if th is None else th.as_dict()}))
""")
SEARCHPATH = f"hydra.searchpath=[file://{REPO}/conf]"  # the top-level link to tensorhub_verl/conf
# After the composition, which must find the plugin on its own: where the plugin module was imported from.
PLUGIN_FILE = "\nimport hydra_plugins.tensorhub_verl_searchpath as m; print('plugin file:', m.__file__)\n"
SECRET = "the-hub-token-that-must-not-be-printed"


def _env(**extra) -> dict[str, str]:
    env = dict(os.environ, **extra)
    if "TENSORHUB_TOKEN" not in extra:
        env.pop("TENSORHUB_TOKEN", None)
    return env


def _check(code: str, *args: str, **env) -> Check:
    return Check(argv=[sys.executable, "-c", code, *args], env=_env(**env), cwd=str(REPO))


def _compose_check(*override_lists, code: str = COMPOSE, **env) -> Check:
    """Each list of overrides composed into verl's ppo_trainer, in one fresh process (verl imports once)."""
    return _check(code, json.dumps(override_lists), **env)


# The composition without the group goes first: nothing composed before it in its process.
NAIVE_AND_MODES = ([], [SEARCHPATH, "+tensorhub=standalone", "tensorhub.keep_versions=4"],
                   [SEARCHPATH, "+tensorhub=standalone", "actor_rollout_ref.rollout.dtype=float16"],
                   [SEARCHPATH, "+tensorhub=cross_dc", "tensorhub.location.rack=r7"])

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


def _entry_point_checks(tmp: Path) -> dict[str, Check]:
    """verl 0.9.1 loads the 'verl.plugins' entry-point group at 'import verl': a probe distribution declares it."""
    dist = tmp / "tensorhub_verl_plugin_probe-0.0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorhub-verl-plugin-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[verl.plugins]\ntensorhub = tensorhub_verl.verl.checkpoint_engine\n")
    return {"entry_point": _check(REGISTRY, "entry_point", PYTHONPATH=str(tmp), VERL_USE_EXTERNAL_PLUGINS="auto")}


def _token_code() -> str:
    return COMPOSE.replace("print(json.dumps(", "print(OmegaConf.to_yaml(cfg)); print(th.resolved_token() == "
                           f"{SECRET!r}); print(json.dumps(")


@pytest.fixture(scope="module")
def checks(request, tmp_path_factory):
    # TENSORHUB_DC in the shell: labels come from each Ray node (node_location), not from the shell of wherever
    # verl's task runner lands.
    runs = fresh_processes(request, {
        "test_standalone_and_cross_dc_compose_with_ppo_trainer": lambda: {
            "modes": _compose_check(*NAIVE_AND_MODES, TENSORHUB_DC="eu1")},
        "test_without_the_group_verl_stays_on_naive": lambda: {
            "modes": _compose_check(*NAIVE_AND_MODES, TENSORHUB_DC="eu1")},
        "test_one_override_with_the_search_path_plugin": lambda: {
            "plugin": _compose_check(["+tensorhub=elastic"], code=COMPOSE + PLUGIN_FILE, PYTHONPATH=str(REPO),
                                     TENSORHUB_HUB_FILE="/x/url")},
        "test_registered_through_custom_backend_module_in_a_fresh_process": lambda: {
            "custom_backend_module": _check(REGISTRY, "custom_backend_module", VERL_USE_EXTERNAL_PLUGINS="none")},
        "test_registered_through_the_verl_plugins_entry_point_in_a_fresh_process": lambda: _entry_point_checks(
            tmp_path_factory.mktemp("plugin_probe")),
        "test_not_registered_without_either_mechanism": lambda: {
            "none": _check(REGISTRY, "none", VERL_USE_EXTERNAL_PLUGINS="none")},
        "test_the_config_dump_never_shows_the_token": lambda: {
            "token": _compose_check([SEARCHPATH, "+tensorhub=standalone"], code=_token_code(),
                                    TENSORHUB_TOKEN=SECRET)},
    })
    yield runs
    runs.close()


def _ok(checks, name: str):
    proc = checks.result(name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _composed(checks, name: str, count: int) -> list[dict]:
    lines = _ok(checks, name).stdout.strip().splitlines()
    return [json.loads(line) for line in lines[-count:]]


def test_standalone_and_cross_dc_compose_with_ppo_trainer(checks):
    _, standalone, float16, cross_dc = _composed(checks, "modes", len(NAIVE_AND_MODES))
    out = standalone
    assert out["backend"] == "tensorhub" and out["module"] == "tensorhub_verl.verl.checkpoint_engine"
    assert out["th"]["keep_versions"] == 4 and out["th"]["staging"] == "cpu" and out["th"]["hub_address"] is None
    assert out["th"]["rollout_dtype"] == "bfloat16"  # verl's rollout.dtype default: the trainer casts to it

    assert float16["th"]["rollout_dtype"] == "float16"

    out = cross_dc
    assert out["th"]["location"] == {"rack": "r7"}
    assert out["th"]["hub_url_file"] == "auto" and out["th"]["hub_placement"] == "head"
    assert out["th"]["link_capacities"]["wan_gbps"] == 100.0 and out["th"]["seeds_per_dc"] is None


def test_one_override_with_the_search_path_plugin(checks):
    """With the repository's own ``hydra_plugins/`` importable (as an install provides it), '+tensorhub=elastic'
    alone is enough: no hydra.searchpath override."""
    lines = _ok(checks, "plugin").stdout.strip().splitlines()
    assert lines[-1].startswith("plugin file: ")
    plugin_file = Path(lines[-1].removeprefix("plugin file: "))
    assert plugin_file == REPO / "hydra_plugins" / "tensorhub_verl_searchpath" / "__init__.py"
    out = json.loads(lines[-2])
    assert out["backend"] == "tensorhub" and out["th"]["keep_versions"] == 3
    assert out["th"]["hub_url_file"] == "/x/url" and out["th"]["min_replica_fraction"] == 0.5


def test_without_the_group_verl_stays_on_naive(checks):
    naive = _composed(checks, "modes", len(NAIVE_AND_MODES))[0]
    assert naive["backend"] == "naive" and naive["th"] is None


def test_registered_through_custom_backend_module_in_a_fresh_process(checks):
    proc = _ok(checks, "custom_backend_module")
    assert proc.stdout.split()[-3:] == ["tensorhub_verl.verl.checkpoint_engine", "TensorHubCheckpointEngine", "True"]
    assert "applied verl patch verl_0_9_1_manager_update_weights" in proc.stderr


def test_registered_through_the_verl_plugins_entry_point_in_a_fresh_process(checks):
    """verl 0.9.1 loads the 'verl.plugins' entry-point group at 'import verl' (not 'verl.checkpoint_engine')."""
    proc = _ok(checks, "entry_point")
    assert proc.stdout.split()[-2:] == ["TensorHubCheckpointEngine", "True"], proc.stdout


def test_not_registered_without_either_mechanism(checks):
    proc = _ok(checks, "none")
    assert proc.stdout.strip().endswith("NOT-REGISTERED")


def test_the_config_dump_never_shows_the_token(checks):
    """verl prints its resolved config; the token is read from the environment where it is used, not copied
    into the config (issue 22 point 13)."""
    proc = _ok(checks, "token")
    lines = proc.stdout.strip().splitlines()
    assert "token_env: TENSORHUB_TOKEN" in proc.stdout and lines[-2] == "True"  # the token is used ...
    assert SECRET not in proc.stdout + proc.stderr  # ... and never printed
