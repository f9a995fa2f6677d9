"""verl's CPU platform and the verl 0.9.1 patches that make its trainer run without a GPU: the CPU harness of the
developer tools (``tensorhub_dev.verl_cpu``), which the product never imports.

The checks that need a fresh process (verl's platform singletons, Hydra's entry points) run two at a time in
the background (``tests/fresh_processes.py``); each test asserts on its own process's output.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from tensorhub_dev.verl_cpu import EXTERNAL_MODULES_ENV, PLUGIN_MODULE, with_plugin
from tensorhub_dev.verl_cpu.hydra_searchpath import conf_dir as cpu_conf_dir
from tensorhub_verl.errors import ConfigError
from tensorhub_verl.verl.patches.on_import import when_imported
from tensorhub_verl.verl.trainer_modes import check_trainer_mode
from tests.fresh_processes import Check, fresh_processes

JOBS = [("grpo", "separate_async"), ("grpo", "fully_async"), ("ppo", "separate_async")]
"""(algorithm, trainer mode) of each CPU preset the demo job composes."""


def _config(mode: str, backend: str = "tensorhub", use_v1: bool = True):
    return OmegaConf.create({"trainer": {"use_v1": use_v1, "v1": {"trainer_mode": mode}},
                             "actor_rollout_ref": {"rollout": {"checkpoint_engine": {"backend": backend}}}})


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_modes_that_force_naive_refuse_tensorhub_and_name_the_ones_that_work(mode):
    with pytest.raises(ConfigError, match=f"trainer_mode={mode}.*separate_async.*fully_async"):
        check_trainer_mode(_config(mode))


def test_modes_that_use_the_backend_and_other_backends_pass():
    check_trainer_mode(_config("separate_async"))
    check_trainer_mode(_config("sync", backend="naive"))
    with pytest.raises(ConfigError, match="use_v1"):
        check_trainer_mode(_config("separate_async", use_v1=False))


def test_a_post_import_hook_runs_once_right_after_its_module_executes(tmp_path, monkeypatch):
    (tmp_path / "th_hooked_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("th_hooked_mod", lambda m: seen.append(m.VALUE))
    assert seen == []
    import th_hooked_mod  # noqa: F401

    assert seen == [1]
    when_imported("th_hooked_mod", lambda m: seen.append(2))  # already imported: runs now
    assert seen == [1, 2]


CPU_PLATFORM = textwrap.dedent("""
    import verl  # loads tensorhub_verl and dev's CPU harness through their verl.plugins entry points
    from verl.utils import device
    from verl.workers.engine.base import EngineRegistry
    import verl.workers.engine.fsdp.transformer_impl  # noqa: F401
    import verl.workers.engine_workers as engine_workers
    import verl.trainer.ppo.v1.trainer_base as trainer_base
    from tensorhub_dev.verl_cpu.patches import CPU_MARK
    from tensorhub_verl.verl.patches.replace import is_replaced
    assert device.get_device_name() == "cpu", device.get_device_name()
    assert device.get_nccl_backend() == "gloo"
    assert str(device.get_device_id()) == "cpu"
    torch_device = device.get_torch_device()
    assert torch_device.memory_allocated() > 0 and torch_device.mem_get_info()[1] > 0
    torch_device.empty_cache(); torch_device.synchronize()
    state = torch_device.get_rng_state(); torch_device.set_rng_state(state)
    engine = EngineRegistry.get_engine_cls("language_model", "fsdp2")
    assert engine.__name__.startswith("FSDP"), engine
    assert is_replaced(engine_workers, "initialize_global_process_group_ray", CPU_MARK)
    # The trainer's start gets both checks: the product's trainer mode and the harness's CPU settings.
    assert is_replaced(trainer_base.PPOTrainer, "__init__") and is_replaced(trainer_base.PPOTrainer, "__init__", CPU_MARK)
    print("CPU-PLATFORM-OK")
""")


NO_PLATFORM = textwrap.dedent("""
    import verl.workers.engine.fsdp.transformer_impl  # noqa: F401
    from verl.plugin.platform import PlatformRegistry
    assert PlatformRegistry.get("cpu") is None, PlatformRegistry.registered_names()
    print("DONE")
""")


def _dev_installed() -> bool:
    """Whether dev/ is installed here (``pip install -e dev/``): its ``verl.plugins`` entry point is declared."""
    from importlib.metadata import entry_points

    return any(ep.value == PLUGIN_MODULE for ep in entry_points(group="verl.plugins"))


def _harness_env() -> dict[str, str]:
    """``VERL_PLATFORM=cpu``; where dev/ is installed, the harness comes through its entry point alone, else
    (dev/ only on the path) through verl's ``VERL_USE_EXTERNAL_MODULES``, as the demo's job names it."""
    env = {k: v for k, v in os.environ.items() if k != EXTERNAL_MODULES_ENV}
    env["VERL_PLATFORM"] = "cpu"
    return env if _dev_installed() else with_plugin(env)


def _job(tmp_path, algorithm: str, trainer_mode: str):
    from tensorhub_dev.demo.job import TinyJob
    from tensorhub_dev.demo.task import TaskFiles

    task = TaskFiles(model_dir=tmp_path / "m", train_file=tmp_path / "t.parquet", val_file=tmp_path / "v.parquet",
                     reward_file=tmp_path / "r.py")
    return TinyJob(task=task, out_dir=tmp_path, steps=2, trainer_mode=trainer_mode, algorithm=algorithm)


def _composition_checks(tmp_path_factory) -> dict[str, Check]:
    """Each job's entry point with ``--cfg job``: Hydra prints the composed config without running anything."""
    checks = {}
    for algorithm, trainer_mode in JOBS:
        job = _job(tmp_path_factory.mktemp(f"{algorithm}-{trainer_mode}"), algorithm, trainer_mode)
        checks[f"{algorithm}-{trainer_mode}"] = Check(argv=[*job.command(), "--cfg", "job"], env=job.environment())
    return checks


@pytest.fixture(scope="module")
def checks(request, tmp_path_factory):
    runs = fresh_processes(request, {
        "test_verl_on_the_cpu_platform_in_a_fresh_process": lambda: {
            "cpu_platform": Check(argv=[sys.executable, "-c", CPU_PLATFORM], env=_harness_env())},
        "test_without_the_setting_nothing_cpu_specific_is_applied": lambda: {
            "no_platform": Check(argv=[sys.executable, "-c", NO_PLATFORM],
                                 env={k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"})},
        "test_the_demo_job_composes_into_a_config_the_checks_accept": lambda: _composition_checks(tmp_path_factory),
    })
    yield runs
    runs.close()


def test_verl_on_the_cpu_platform_in_a_fresh_process(checks):
    """VERL_PLATFORM=cpu is the one setting: verl's device helpers, its FSDP engine lookup and its
    process-group set-up all take the CPU path (each is a separate process-wide singleton, hence a subprocess)."""
    proc = checks.result("cpu_platform")
    assert "CPU-PLATFORM-OK" in proc.stdout, proc.stderr[-3000:]
    assert "applied verl patch verl_0_9_1_cpu_engine_registry" in proc.stderr
    assert "applied verl patch verl_0_9_1_cpu_process_group" in proc.stderr
    assert "applied verl patch verl_0_9_1_cpu_job_check" in proc.stderr


def test_without_the_setting_nothing_cpu_specific_is_applied(checks):
    proc = checks.result("no_platform")
    assert "DONE" in proc.stdout, proc.stderr[-3000:]
    assert "verl_0_9_1_cpu_engine_registry" not in proc.stderr and "verl_0_9_1_cpu_job_check" not in proc.stderr


def test_a_cpu_job_missing_settings_is_refused_with_every_fix_named():
    from tensorhub_dev.verl_cpu.job_check import check_cpu_job

    bad = OmegaConf.create({"actor_rollout_ref": {
        "rollout": {"dtype": "bfloat16", "enable_sleep_mode": True, "free_cache_engine": True},
        "model": {"use_remove_padding": True}, "actor": {"use_torch_compile": True}}})
    with pytest.raises(ConfigError) as info:
        check_cpu_job(bad)
    for fix in ("rollout.dtype=float32", "enable_sleep_mode=False", "free_cache_engine=False",
                "use_remove_padding=False", "use_torch_compile=False", "attn_implementation=eager", "tiny_grpo"):
        assert fix in str(info.value)
    preset = OmegaConf.load(cpu_conf_dir() / "tensorhub_cpu" / "tiny_grpo.yaml")
    check_cpu_job(preset)  # the preset passes its own check


@pytest.mark.parametrize(("algorithm", "trainer_mode"), JOBS)
def test_the_demo_job_composes_into_a_config_the_checks_accept(checks, algorithm, trainer_mode):
    """Hydra composes verl's config with +tensorhub=standalone and the CPU preset (``--cfg job`` prints it
    without running anything); the result selects TensorHub and passes the CPU-job and trainer-mode checks."""
    from tensorhub_dev.verl_cpu.job_check import check_cpu_job, uses_critic

    proc = checks.result(f"{algorithm}-{trainer_mode}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line and line[0].isalpha() and line.endswith(":"))
    config = OmegaConf.create("\n".join(lines[start:]))
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "tensorhub"
    assert config.actor_rollout_ref.rollout.n_gpus_per_node == 2
    check_cpu_job(config)
    check_trainer_mode(config)
    assert uses_critic(config) is (algorithm == "ppo")
    if algorithm == "ppo":  # the critic is the actor's model, loaded with CPU attention
        assert config.critic.model.path == config.actor_rollout_ref.model.path  # the job's model directory
        assert config.critic.model.path.endswith("/m")
        assert config.critic.model.override_config.attn_implementation == "eager"
    if trainer_mode == "fully_async":  # the preset's fully_async settings, sized by the job
        assert config.rollout.n_gpus_per_node == 2 and config.rollout.n == config.actor_rollout_ref.rollout.n
        assert config.rollout.total_rollout_steps == 2 * 8
        assert config.async_training.trigger_parameter_sync_step == 1
        assert config.async_training.partial_rollout is False and config.data.train_batch_size == 0


def test_a_ppo_job_on_cpu_needs_the_critic_settings_too():
    from tensorhub_dev.verl_cpu.job_check import check_cpu_job

    grpo_ok = OmegaConf.load(cpu_conf_dir() / "tensorhub_cpu" / "tiny_grpo.yaml")
    ppo = OmegaConf.merge(grpo_ok, {"algorithm": {"adv_estimator": "gae"},
                                    "critic": {"model": {"use_remove_padding": True}}})
    with pytest.raises(ConfigError) as info:
        check_cpu_job(ppo)
    for fix in ("critic.model.use_remove_padding=False",
                "critic.model.override_config.attn_implementation=eager", "tiny_ppo"):
        assert fix in str(info.value)
    assert "actor_rollout_ref" not in str(info.value)  # the actor's settings are right: not named
    check_cpu_job(OmegaConf.merge(ppo, {"critic": {"enable": False}}))  # no critic: its settings don't count
    flash = OmegaConf.merge(ppo, {"critic": {"model": {"use_remove_padding": False, "override_config": {
        "attn_implementation": "flash_attention_2"}}}})
    with pytest.raises(ConfigError, match=r"critic\.model\.override_config\.attn_implementation=eager \(is"):
        check_cpu_job(flash)


def test_the_critic_attention_patch_replaces_only_the_hard_coded_choice():
    from tensorhub_dev.verl_cpu.patches.verl_0_9_1_critic_attention import replace_hard_coded, requested_attention

    asked = {"torch_dtype": "f32", "attn_implementation": "flash_attention_2"}
    assert replace_hard_coded(asked, "eager") == {"torch_dtype": "f32", "attn_implementation": "eager"}
    assert asked["attn_implementation"] == "flash_attention_2"  # the caller's dict is not changed
    assert replace_hard_coded({"attn_implementation": "sdpa"}, "eager") == {"attn_implementation": "sdpa"}
    assert replace_hard_coded({}, "eager") == {}
    assert requested_attention(type("C", (), {"_attn_implementation": "eager"})()) == "eager"
    assert requested_attention(object()) is None


def _apply_critic_patch() -> None:
    """The harness's critic patch on verl's real loader, as its plugin applies it on the CPU platform
    (idempotent); the replacement itself checks ``VERL_PLATFORM`` at call time."""
    import verl.utils.model

    from tensorhub_dev.verl_cpu.patches import verl_0_9_1_critic_attention as patch

    patch.apply(verl.utils.model)


@pytest.fixture
def value_model(tmp_path):
    """A tiny model's directory and its config as verl's HFModelConfig builds it from override_config."""
    from transformers import AutoConfig

    from tensorhub_verl.bench.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "m", arch="qwen2", hidden_size=64, intermediate_size=128,
                                 num_layers=1, num_heads=2, num_kv_heads=1)
    config = AutoConfig.from_pretrained(str(model_dir), attn_implementation="eager")
    config.num_labels = 1
    return str(model_dir), config


def test_off_the_cpu_platform_the_critic_loads_as_verl_ships_it(value_model, monkeypatch):
    """verl 0.9.1 asks for flash_attention_2 whatever the config says; without flash-attn the load fails."""
    import torch

    _apply_critic_patch()
    from verl.utils.model import load_valuehead_model

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here: verl's own loader succeeds, there is no failure to keep")
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    with pytest.raises(Exception, match="flash|value head"):
        load_valuehead_model(value_model[0], torch.float32, value_model[1], False)


def test_on_the_cpu_platform_the_critic_honours_the_configured_attention(value_model, monkeypatch):
    import torch
    from transformers import PreTrainedModel

    transformers_loader = PreTrainedModel.__dict__["from_pretrained"]
    _apply_critic_patch()
    from verl.utils.model import load_valuehead_model

    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    critic = load_valuehead_model(value_model[0], torch.float32, value_model[1], False)
    assert critic.config._attn_implementation == "eager"
    assert critic.score.weight.shape == (1, 64)  # a value head: one output per token
    assert PreTrainedModel.__dict__["from_pretrained"] is transformers_loader  # transformers' method restored
