"""Each verl patch changes behaviour only for jobs that use TensorHub: a job with another backend gets verl 0.9.1's
own behaviour, a tensorhub job the patched one (the CPU harness's patches: tests/verl/test_cpu_platform_on_cpu.py). In-process,
no Ray: the patches are applied to verl's real modules (or to a stand-in where verl's needs a running job)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import textwrap

import pytest

from tensorhub_verl.verl.patches.guards import engine_uses_tensorhub, job_uses_tensorhub


def _job(backend: str) -> dict:
    """A verl job's config as verl hands it to ``Tracking`` (``OmegaConf.to_container``)."""
    return {"trainer": {"project_name": "p"}, "actor_rollout_ref": {"rollout": {
        "checkpoint_engine": {"backend": backend}}}}


def test_the_guards_read_the_backend_from_a_job_or_an_engine_config():
    from omegaconf import OmegaConf

    assert job_uses_tensorhub(_job("tensorhub")) and job_uses_tensorhub(OmegaConf.create(_job("tensorhub")))
    assert not job_uses_tensorhub(_job("naive"))
    assert not job_uses_tensorhub(None) and not job_uses_tensorhub({})
    assert engine_uses_tensorhub({"backend": "tensorhub"}) and not engine_uses_tensorhub({"backend": "nccl"})


# verl 0.9.1's PPOTrainerSeparateAsync._setup logs through its module's logger with flush=True.
SEPARATE_ASYNC = textwrap.dedent("""
    import logging
    logger = logging.getLogger("tensorhub_verl.tests.fake_separate_async")

    class PPOTrainerSeparateAsync:
        def __init__(self, config):
            self.config = config

        def _setup(self):
            logger.info("replicas: %d", 2, flush=True)
            return "set up"
""")


@pytest.fixture
def separate_async():
    module = type(sys)("fake_separate_async")
    exec(SEPARATE_ASYNC, module.__dict__)
    from tensorhub_verl.verl.patches import verl_0_9_1_logger_flush as patch

    assert patch.apply(module) is True and patch.apply(module) is False
    return module


def test_the_flush_keyword_is_dropped_only_in_a_tensorhub_job(separate_async, caplog):
    verl_logger = separate_async.logger
    with caplog.at_level(logging.INFO, logger=verl_logger.name):
        with pytest.raises(TypeError, match="flush"):  # verl's own behaviour, unchanged for other backends
            separate_async.PPOTrainerSeparateAsync(_job("naive"))._setup()
        assert separate_async.PPOTrainerSeparateAsync(_job("tensorhub"))._setup() == "set up"
    assert "replicas: 2" in caplog.text
    assert separate_async.logger is verl_logger  # verl's logger is back once the set-up is over


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    """verl's real tracking module, patched; its file logger writes to a file that already holds a line."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0, "data": {"old": 1}}) + "\n")
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    import verl.utils.tracking as module

    from tensorhub_verl.verl.patches import verl_0_9_1_file_logger_append as patch

    patch.apply(module)  # already applied if the verl.plugins entry point ran: then a no-op
    return module, path


def _keys(path) -> list[list[str]]:
    return [sorted(json.loads(line)["data"]) for line in path.read_text().splitlines()]


def test_a_job_with_another_backend_truncates_the_file_as_verl_does(tracking):
    module, path = tracking
    logger = module.Tracking("p", "e", default_backend="file", config=_job("naive"))
    logger.log({"new": 1}, step=1)
    assert _keys(path) == [["new"]]
    assert module.FileLogger("p", "e").fp.mode == "wb"  # built outside a tensorhub Tracking: verl's mode


def test_a_tensorhub_job_appends_so_two_processes_keep_every_line(tracking):
    """fully_async's rollouter and trainer each build a Tracking with the job's config on the same path."""
    module, path = tracking
    rollouter = module.Tracking("p", "e", default_backend="file", config=_job("tensorhub"))
    rollouter.log({"r": 1}, step=1)
    trainer = module.Tracking("p", "e", default_backend="file", config=_job("tensorhub"))
    trainer.log({"t": 1}, step=1)
    rollouter.log({"r": 2}, step=2)
    assert _keys(path) == [["old"], ["r"], ["t"], ["r"]]


class _Engine:
    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return [f"{method} on rank 0", f"{method} on rank 1"]


class _Server:
    """verl 0.9.1's ``vLLMHttpServer``, reduced to the two methods the patch replaces."""

    def __init__(self, backend: str):
        engine = type("CheckpointEngineConfig", (), {"backend": backend})
        self.config = type("RolloutConfig", (), {"checkpoint_engine": engine})
        self.engine = _Engine()

    def _get_worker_extension_cls(self) -> str:
        return "verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension"

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        await self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)


def test_only_a_tensorhub_rollout_server_loads_our_extension_and_returns_results():
    from tensorhub_verl.verl.patches import verl_0_9_1_engine_holders as patch
    from tensorhub_verl.verl.vllm_worker import EXTENSION_QUALNAME

    module = type(sys)("fake_vllm_async_server")
    module.vLLMHttpServer = type("vLLMHttpServer", (_Server,), {})
    assert patch.apply(module) is True and patch.apply(module) is False
    verl_job, tensorhub_job = module.vLLMHttpServer("nccl"), module.vLLMHttpServer("tensorhub")
    assert verl_job._get_worker_extension_cls() == _Server._get_worker_extension_cls(verl_job)
    assert asyncio.run(verl_job.collective_rpc("th_status")) is None  # verl drops the results
    assert tensorhub_job._get_worker_extension_cls() == EXTENSION_QUALNAME
    results = asyncio.run(tensorhub_job.collective_rpc("th_status"))
    assert results == ["th_status on rank 0", "th_status on rank 1"]


def test_only_a_tensorhub_job_forwards_the_drivers_settings_to_every_node(monkeypatch):
    """The runtime environment Ray applies on every node carries the driver's TensorHub settings, not the
    driver's own location labels (each node keeps its own) nor its launcher pid."""
    from omegaconf import OmegaConf

    import verl.trainer.constants_ppo as constants
    from tensorhub_verl.process_group import EXIT_WITH_PARENT_ENV
    from tensorhub_verl.verl.patches import verl_0_9_1_runtime_env_settings as patch
    from tensorhub_verl.verl.patches.replace import is_replaced

    patch.apply(constants)  # already applied if the plugin loaded at `import verl`
    assert is_replaced(constants, "get_ppo_ray_runtime_env")
    for name, value in {"TENSORHUB_TOKEN": "t0k", "TENSORHUB_HUB_FILE": "/jobs/7/hub_url", "TENSORHUB_DC": "dc9",
                        "TENSORHUB_RACK": "r9", EXIT_WITH_PARENT_ENV: "123",
                        "VERL_FILE_LOGGER_PATH": "/jobs/7/metrics.jsonl"}.items():
        monkeypatch.setenv(name, value)
    env_vars = constants.get_ppo_ray_runtime_env(OmegaConf.create(_job("tensorhub")))["env_vars"]
    assert env_vars["TENSORHUB_TOKEN"] == "t0k" and env_vars["TENSORHUB_HUB_FILE"] == "/jobs/7/hub_url"
    assert env_vars["VERL_FILE_LOGGER_PATH"] == "/jobs/7/metrics.jsonl"
    assert not {"TENSORHUB_DC", "TENSORHUB_RACK", EXIT_WITH_PARENT_ENV} & set(env_vars)
    other = constants.get_ppo_ray_runtime_env(OmegaConf.create(_job("nccl")))["env_vars"]
    assert not any(name.startswith("TENSORHUB_") for name in other) and "VERL_FILE_LOGGER_PATH" not in other


def test_main_ppo_reads_the_patched_runtime_environment():
    """``main_ppo`` binds the function by name at import: the patch must be in place before (a fresh process,
    as ``python -m verl.trainer.main_ppo`` starts)."""
    import subprocess

    code = ("import verl.trainer.main_ppo as m; from tensorhub_verl.verl.patches.replace import is_replaced; "
            "print(is_replaced(m, 'get_ppo_ray_runtime_env'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "True", proc.stderr[-2000:]
