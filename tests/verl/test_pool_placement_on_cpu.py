"""Where verl's trainer and rollout pools are placed (``tensorhub.trainer_placement`` / ``rollout_placement``),
without a cluster: the settings, their trip through the job's runtime environment, and what verl's
``placement_group`` call receives. The placement groups on a real multi-node cluster: tests/netlab."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.verl.config import TensorHubVerlConfig
from tensorhub_verl.verl.patches import PLACEMENT_ENV, placement_asked
from tensorhub_verl.verl.pool_placement import RESOURCE_SLIVER, placed_group_args, placement_env, pool_role

BUNDLES = [{"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}]
ENV = {"TENSORHUB_TRAINER_PLACEMENT": "label:tensorhub/dc=dc0", "TENSORHUB_ROLLOUT_PLACEMENT": "resource:th_roll"}


def test_verl_pool_names_map_to_roles():
    assert pool_role("global_poolverl_group_1:0") == "trainer"      # v1 separate_async
    assert pool_role("trainer_poolverl_group_2_2:1") == "trainer"   # fully_async
    assert pool_role("rollout_pool_3verl_group_1:0") == "rollout"
    assert pool_role("rollout_pool_reward_0verl_group_1:0") is None
    assert pool_role("teacher_poolverl_group_1:0") is None
    assert pool_role(None) is None


def test_labels_become_bundle_selectors_and_resources_a_sliver_per_bundle():
    bundles, selector = placed_group_args("global_poolverl_group_2:0", BUNDLES, ENV)
    assert bundles == BUNDLES and selector == [{"tensorhub/dc": "dc0"}] * 2
    bundles, selector = placed_group_args("rollout_pool_0verl_group_2:0", BUNDLES, ENV)
    assert selector is None and bundles == [{**b, "th_roll": RESOURCE_SLIVER} for b in BUNDLES]
    # A pool with no placement, or a job with none, is verl's own request.
    assert placed_group_args("teacher_poolverl_group_2:0", BUNDLES, ENV) == (BUNDLES, None)
    assert placed_group_args("global_poolverl_group_2:0", BUNDLES, {}) == (BUNDLES, None)


def test_the_config_reaches_the_runtime_environment_and_bad_forms_are_refused():
    cfg = OmegaConf.create({"trainer_placement": "label:tensorhub/node=h0", "rollout_placement": "any"})
    assert placement_env(cfg) == {"TENSORHUB_TRAINER_PLACEMENT": "label:tensorhub/node=h0"}
    assert placement_env(None) == {}
    with pytest.raises(ConfigError, match="tensorhub.rollout_placement must be one of any, label:KEY=VALUE"):
        TensorHubVerlConfig(rollout_placement="head")
    with pytest.raises(ConfigError, match="tensorhub.trainer_placement"):
        placement_env({"trainer_placement": "label:nokey"})


def test_the_patch_adds_the_selector_to_verls_placement_group_call(monkeypatch):
    import types

    from tensorhub_verl.verl.patches import verl_0_9_1_pool_placement as patch

    calls = []
    module = types.SimpleNamespace(placement_group=lambda bundles, **kw: calls.append((bundles, kw)))
    assert patch.apply(module) and not patch.apply(module)  # idempotent
    monkeypatch.setenv("TENSORHUB_ROLLOUT_PLACEMENT", "label:tensorhub/dc=dc1")
    module.placement_group(bundles=BUNDLES, strategy="PACK", name="rollout_pool_0verl_group_2:0", lifetime=None)
    module.placement_group(bundles=BUNDLES, strategy="PACK", name="global_poolverl_group_2:0", lifetime=None)
    assert calls[0][1]["bundle_label_selector"] == [{"tensorhub/dc": "dc1"}] * 2
    assert "bundle_label_selector" not in calls[1][1] and calls[1][0] == BUNDLES


def test_a_tensorhub_jobs_runtime_environment_carries_its_placements():
    """The variables that carry the placements are what asks for the placement patches in every worker
    (``test_the_placement_patches_load_only_where_a_placement_is_set``)."""
    import verl.trainer.constants_ppo as constants
    from tensorhub_verl.verl.patches import verl_0_9_1_runtime_env_settings as patch

    patch.apply(constants)  # already applied if the plugin loaded at `import verl`
    job = {"actor_rollout_ref": {"rollout": {"checkpoint_engine": {"backend": "tensorhub"}}},
           "tensorhub": {"trainer_placement": "any", "rollout_placement": "label:tensorhub/dc=dc1"}}
    env_vars = constants.get_ppo_ray_runtime_env(OmegaConf.create(job))["env_vars"]
    assert env_vars["TENSORHUB_ROLLOUT_PLACEMENT"] == "label:tensorhub/dc=dc1"
    assert "TENSORHUB_TRAINER_PLACEMENT" not in env_vars
    assert placement_asked(env_vars)


NODES = [{"NodeID": "a", "Labels": {"tensorhub/node": "d0r0h0"}, "Resources": {"CPU": 2}},
         {"NodeID": "b", "Labels": {"tensorhub/node": "d1r0h0"}, "Resources": {"CPU": 2, "th_roll": 1}}]


def test_helper_placement_becomes_actor_options_and_narrows_the_nodes_verl_spreads_helpers_over():
    from tensorhub_verl.verl.pool_placement import helper_actor_options, helper_nodes

    assert helper_actor_options("label:tensorhub/node=d0r0h0") == {"label_selector": {"tensorhub/node": "d0r0h0"}}
    assert helper_actor_options("resource:th_roll") == {"resources": {"th_roll": RESOURCE_SLIVER}}
    assert helper_actor_options("any") == {} and helper_actor_options(None) == {}
    narrowed = helper_nodes(NODES, {"TENSORHUB_HELPER_PLACEMENT": "label:tensorhub/node=d0r0h0"})
    assert [n["NodeID"] for n in narrowed] == ["a"]
    assert [n["NodeID"] for n in helper_nodes(NODES, {"TENSORHUB_HELPER_PLACEMENT": "resource:th_roll"})] == ["b"]
    assert helper_nodes(NODES, {}) == NODES
    # No node fits: verl still gets every node (Ray's scheduler, not an empty list, says what is wrong).
    assert helper_nodes(NODES, {"TENSORHUB_HELPER_PLACEMENT": "label:tensorhub/node=nowhere"}) == NODES
    assert placement_env({"helper_placement": "label:k=v"}) == {"TENSORHUB_HELPER_PLACEMENT": "label:k=v"}
    with pytest.raises(ConfigError, match="tensorhub.helper_placement must be one of"):
        TensorHubVerlConfig(helper_placement="head")


def test_the_patches_place_verls_task_runner_and_narrow_its_helper_loops_nodes(monkeypatch):
    import types

    from tensorhub_verl.verl.patches import verl_0_9_1_helper_loop_placement as loops
    from tensorhub_verl.verl.patches import verl_0_9_1_task_runner_placement as runner

    calls = []
    main_ppo = types.SimpleNamespace(run_ppo=lambda config, task_runner_class: calls.append(task_runner_class))
    assert runner.apply(main_ppo) and not runner.apply(main_ppo)  # idempotent
    job = {"actor_rollout_ref": {"rollout": {"checkpoint_engine": {"backend": "tensorhub"}}},
           "tensorhub": {"helper_placement": "label:tensorhub/node=d0r0h0"}}
    main_ppo.run_ppo(OmegaConf.create(job), task_runner_class="TaskRunner")
    main_ppo.run_ppo(OmegaConf.create({"tensorhub": job["tensorhub"]}), task_runner_class="TaskRunner")
    assert isinstance(calls[0], runner.PlacedActorClass)
    assert calls[0]._options == {"label_selector": {"tensorhub/node": "d0r0h0"}}
    assert calls[1] == "TaskRunner"  # not a TensorHub job: verl's call unchanged

    agent_loop = types.SimpleNamespace(ray=types.SimpleNamespace(nodes=lambda: NODES, get_actor="ray's"))
    assert loops.apply(agent_loop) and not loops.apply(agent_loop)
    assert agent_loop.ray.get_actor == "ray's"  # everything else is Ray's
    assert agent_loop.ray.nodes() == NODES
    monkeypatch.setenv("TENSORHUB_HELPER_PLACEMENT", "resource:th_roll")
    assert [n["NodeID"] for n in agent_loop.ray.nodes()] == ["b"]


def test_the_package_entry_point_runs_main_ppo_with_the_task_runner_patch_applied():
    """``python -m verl.trainer.main_ppo`` runs verl's module as ``__main__``, out of the import hook's reach; the
    package's entry point imports it as a module, so the task runner's placement patch is applied (a fresh
    process; ``--cfg job`` composes the config and stops before Ray)."""
    done = subprocess.run([sys.executable, "-m", "tensorhub_verl.verl.main_ppo", "--cfg", "job"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "applied verl patch verl_0_9_1_task_runner_placement" in done.stderr
    assert "trainer:" in done.stdout


PLACEMENT_PATCHED = textwrap.dedent("""
    import json
    import verl.experimental.agent_loop.agent_loop as agent_loop
    import verl.single_controller.ray.base as base
    from tensorhub_verl.verl.patches.replace import is_replaced
    print(json.dumps({"pools": is_replaced(base, "placement_group"),
                      "helpers": type(agent_loop.ray).__name__ == "PlacedNodes"}))
""")


@pytest.mark.parametrize("placement", [None, "resource:th_roll"])
def test_the_placement_patches_load_only_where_a_placement_is_set(placement):
    """A process whose environment carries no placement (a job that places nothing) runs verl's placement code
    untouched; one that carries a placement (a job's runtime environment with ``tensorhub.*_placement`` set) gets
    both placement patches at ``import verl`` (fresh processes: the plugin decides when verl loads it)."""
    env = {k: v for k, v in os.environ.items() if k not in PLACEMENT_ENV}
    if placement:
        env["TENSORHUB_ROLLOUT_PLACEMENT"] = placement
    done = subprocess.run([sys.executable, "-c", PLACEMENT_PATCHED], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"pools": bool(placement), "helpers": bool(placement)}
    assert ("applied verl patch verl_0_9_1_pool_placement" in done.stderr) is bool(placement)
    assert "verl_0_9_1_task_runner_placement" not in done.stderr  # only python -m tensorhub_verl.verl.main_ppo


def test_the_preflight_reports_every_placement_patch_whether_or_not_it_is_registered_here():
    from tensorhub_verl.verl.patches import apply_all

    assert not placement_asked({}) and not placement_asked({"TENSORHUB_HELPER_PLACEMENT": "any"})
    assert placement_asked({"TENSORHUB_TRAINER_PLACEMENT": "label:k=v"})
    results = {r.name: r for r in apply_all("0.9.1", environ={})}
    for name in ("verl_0_9_1_pool_placement", "verl_0_9_1_helper_loop_placement", "verl_0_9_1_task_runner_placement"):
        assert results[name].applied and "fits" in results[name].reason, results[name]
    assert not [r for r in apply_all("0.8.0", environ={}) if r.applied]  # another verl: every patch is reported
