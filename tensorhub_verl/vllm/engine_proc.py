"""A vLLM engine (``vllm.LLM`` + the TensorHub worker extension) in its own process, driven over a pipe.

Tests and benchmarks need several engines at once; vLLM keeps per-process global state, so each engine gets
a spawned process. The child runs vLLM in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` at TP=1), so its
worker -- and its ROS client -- live in that child. Every request waits at most its timeout; the pipe only
connects this process to a child it spawned (never a network peer).

    parent ──(cmd, kwargs)──► child: LLM(load_format="dummy", worker_extension_cls=...) + EngineUpdater
           ◄──(ok, value)───
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from tensorhub_verl import errors

logger = logging.getLogger("tensorhub_verl.vllm.engine_proc")

LORA_INT_ID = 1
"""The adapter id a test engine loads ``<model>.lora`` under."""

ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_LOOPBACK_IP": "127.0.0.1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass(slots=True, kw_only=True)
class EngineSpec:
    """How to build the engine and connect it to the hub."""

    model_dir: str
    hub_url: str
    worker: str
    model: str = "policy"
    location: dict[str, str] | None = None
    token: str | None = None
    staging: str = "cpu"
    tp_size: int = 1
    load_format: str = "dummy"
    max_model_len: int = 256
    quantization: str | None = None
    """vLLM's ``quantization`` (e.g. ``fp8``); None: unquantized."""
    bucket_bytes: int | None = None
    """Most HF bytes per bucket when versions go through the engine's loader (None: the default)."""
    client_config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the child (e.g. UCX_TLS)."""
    lora_rank: int = 0
    """> 0: the engine runs with vLLM's LoRA (``max_lora_rank``) and follows ``<model>.lora`` as adapter
    ``LORA_INT_ID`` (``lora_update``; ``generate(..., lora=True)`` serves with it)."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """More ``vllm.LLM`` arguments, last (e.g. ``dtype``, ``gpu_memory_utilization``, ``enable_sleep_mode`` on a
    GPU)."""
    api: str = "extension"
    """``extension``: drive the worker extension (EngineUpdater); ``weight_transfer``: vLLM's own
    weight-transfer API with the ``tensorhub`` backend (``update`` then returns that backend's result)."""


def engine_kwargs(model_dir: str, *, tp_size: int = 1, load_format: str = "dummy",
                  max_model_len: int = 256) -> dict[str, Any]:
    """``vllm.LLM`` / ``AsyncEngineArgs`` arguments for an engine that TensorHub updates."""
    from tensorhub_verl.vllm.extension import EXTENSION_QUALNAME

    kw: dict[str, Any] = dict(model=model_dir, tokenizer=model_dir, load_format=load_format,
                              worker_extension_cls=EXTENSION_QUALNAME, enforce_eager=True,
                              max_model_len=max_model_len, tensor_parallel_size=tp_size, seed=0)
    from tensorhub_verl.vllm import compat

    if compat.is_cpu_platform():
        kw["dtype"] = "float32"  # bf16 dies in vLLM's CPU attention
    return kw


def move_weights(worker, discard: bool = False) -> int:
    """What vLLM's sleep does to the weights' memory, on a CPU engine (whose sleep is a no-op): each parameter
    moves to new storage (a copy of its bytes, or NaN when ``discard``: level 2 drops them) and its old storage,
    kept alive so that its address is not reused, is overwritten with NaN. A read served from a registration
    of the old memory then returns NaN, never the weights. Returns the number of parameters moved."""
    import torch

    from tensorhub_verl.vllm import compat

    old = []
    with torch.no_grad():
        for p in compat.worker_model(worker).parameters():
            fresh = torch.full_like(p.data, float("nan")) if discard else p.data.clone()
            old.append(p.data)
            p.data = fresh
        for t in old:
            t.fill_(float("nan"))
    worker._tensorhub_test_old_weights = getattr(worker, "_tensorhub_test_old_weights", []) + old
    return len(old)


def rot_weight(worker, name: str) -> float:
    """Changes the first element of the live parameter ``name`` behind the holder's back (bit rot, or a bug that
    wrote the weights): the engine then no longer holds the version it says it serves. Returns the new value."""
    import torch

    from tensorhub_verl.vllm import compat

    params = dict(compat.worker_model(worker).named_parameters())
    with torch.no_grad():
        flat = params[name].data.view(-1)
        flat[0] += 1.0
        return float(flat[0])


def load_checkpoint(worker, path: str) -> int:
    """Loads the HF safetensors file ``path`` through vLLM's own loader (a reference independent of TensorHub's
    transfer and mapping). Returns the number of tensors."""
    from safetensors.torch import load_file

    from tensorhub_verl.vllm import compat

    tensors = load_file(path)
    compat.load_hf_weights(worker, iter(tensors.items()))
    return len(tensors)


def _child(conn, spec_dict: dict) -> None:
    spec = EngineSpec(**spec_dict)
    os.environ.update(ENGINE_ENV)
    os.environ.update(spec.env)
    if spec.tp_size > 1:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    logging.basicConfig(level=os.environ.get("TENSORHUB_LOG_LEVEL", "WARNING"))
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        import tensorhub_verl.vllm.extension  # noqa: F401  (prepares this process before the model loads)
        from tensorhub_verl.vllm.engine_updater import EngineUpdater, llm_rpc

        t0 = time.monotonic()
        kw = engine_kwargs(spec.model_dir, tp_size=spec.tp_size, load_format=spec.load_format,
                           max_model_len=spec.max_model_len)
        if spec.quantization:
            kw["quantization"] = spec.quantization
        if spec.tp_size > 1:
            kw["distributed_executor_backend"] = "mp"
        if spec.api == "weight_transfer":
            kw["weight_transfer_config"] = {"backend": "tensorhub"}
        if spec.lora_rank > 0:
            kw.update(enable_lora=True, max_lora_rank=spec.lora_rank, max_loras=1)
        kw.update(spec.engine_args)
        llm = LLM(**kw)
        updater = EngineUpdater(llm_rpc(llm))
        if spec.api == "weight_transfer":
            llm.init_weight_transfer_engine({"init_info": {
                "hub_url": spec.hub_url, "model": spec.model, "worker": spec.worker, "location": spec.location,
                "token": spec.token, "staging": spec.staging, "client_config": spec.client_config}})
        else:
            updater.setup(spec.hub_url, spec.model, spec.worker, location=spec.location, token=spec.token,
                          staging=spec.staging, client_config=spec.client_config,
                          bucket_bytes=spec.bucket_bytes)
        if spec.lora_rank > 0:
            updater.call("th_lora_setup", lora_int_id=LORA_INT_ID)
        conn.send((True, {"startup_s": time.monotonic() - t0}))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send((False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return

    def generate(prompt_ids: list[int], max_tokens: int, lora: bool = False) -> list[int]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        request = None
        if lora:
            from vllm.lora.request import LoRARequest

            # The adapter is already loaded under this id (lora_update); the path is never read.
            request = LoRARequest(lora_name="tensorhub", lora_int_id=LORA_INT_ID, lora_path="tensorhub")
        out = llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids))], params, use_tqdm=False,
                           lora_request=request)
        return list(out[0].outputs[0].token_ids)

    def prompt_logprobs(prompt_ids: list[int]) -> list[float]:
        """The log-probability the engine gives each prompt token after the ones before it (the first has none):
        the served logits, read through vLLM's own sampler."""
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        out = llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids))], params, use_tqdm=False)
        return [float(lp[token].logprob) for token, lp in zip(prompt_ids[1:], out[0].prompt_logprobs[1:])]

    def update_while_generating(version, prompt_ids, max_tokens, timeout=300.0) -> dict:
        """Starts the pull, keeps generating until every rank pulled, then applies (the only stall)."""
        t0 = time.monotonic()
        v = updater.begin(version)
        steps = 0
        while True:
            st = updater.status()
            if not any(s.pulling for s in st):
                break
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"pull of v{v} still running after {timeout} s")
            generate(prompt_ids, max_tokens)
            steps += 1
        res = updater.finish(timeout).as_dict()
        res["generate_calls_during_pull"] = steps
        return res

    def wt_update(version="latest", timeout=300.0) -> dict:
        """One update through vLLM's weight-transfer API (start / update_weights / finish)."""
        llm.start_weight_update()
        llm.update_weights({"update_info": {"version": version, "timeout_s": timeout}})
        llm.finish_weight_update()
        return llm.collective_rpc(lambda worker: worker.weight_transfer_engine.last_result)[0].as_dict()

    handlers = {
        "generate": generate,
        "prompt_logprobs": prompt_logprobs,
        "update": (wt_update if spec.api == "weight_transfer"
                   else lambda version="latest", timeout=300.0: updater.update(version, timeout).as_dict()),
        "begin": lambda version="latest": updater.begin(version),
        "finish": lambda timeout=300.0: updater.finish(timeout).as_dict(),
        "update_while_generating": update_while_generating,
        "status": updater.status,
        "lora_update": lambda version="latest", timeout=300.0: updater.call(
            "th_lora_update", timeout=timeout + 30, version=version, timeout_s=timeout),
        "served_version": updater.served_version,
        "rpc": lambda method, **kw: updater.call(method, **kw),
        "sleep": lambda level=1: llm.sleep(level=level),
        "wake_up": lambda tags=None: llm.wake_up(tags),
        "move_weights": lambda discard=False: llm.collective_rpc(move_weights, kwargs={"discard": discard}),
        "load_checkpoint": lambda path: llm.collective_rpc(load_checkpoint, kwargs={"path": path}),
        "rot_weight": lambda name: llm.collective_rpc(rot_weight, kwargs={"name": name}),
    }
    while True:
        cmd, kwargs = conn.recv()
        if cmd == "close":
            try:
                if spec.api == "extension":
                    updater.shutdown()
                # vLLM's own shutdown: its engine core, a TP>1 engine's workers, the process groups.
                llm.llm_engine.engine_core.shutdown()
            finally:
                conn.send((True, None))
            # Nothing is left to release: skip the interpreter's teardown of torch's and vLLM's modules, which
            # keeps a closed engine's process alive for seconds (a test waits for it to be gone).
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        try:
            conn.send((True, handlers[cmd](**kwargs)))
        except BaseException as e:  # noqa: BLE001 - reported to the parent with its type name
            conn.send((False, f"{type(e).__name__}: {e}"))


def _reap(processes: list, grace_s: float = 10.0) -> None:
    """Kills what outlived its parent engine: a closed TP>1 engine otherwise leaves vLLM's EngineCore and its
    workers behind, several GB each, and later engines on the machine get killed for memory."""
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


class EngineError(errors.TensorHubError):
    """The engine process reported an error; the message starts with the remote exception's type name."""


class EngineProcess:
    """Parent-side handle of one engine process. Use as a context manager."""

    def __init__(self, spec: EngineSpec, start_timeout_s: float = 300.0):
        ctx = mp.get_context("spawn")
        self.spec = spec
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child, asdict(spec)), daemon=False,
                                 name=f"vllm-engine-{spec.worker}")
        self._proc.start()
        child.close()
        self.startup = self._wait(start_timeout_s, "start")

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def _wait(self, timeout: float, what: str):
        if not self._conn.poll(timeout):
            self.kill()
            raise TimeoutError(f"engine {self.spec.worker}: no answer to {what!r} within {timeout} s")
        try:
            ok, value = self._conn.recv()
        except EOFError:
            raise EngineError(f"engine {self.spec.worker} exited during {what!r} "
                              f"(exit code {self._proc.exitcode})") from None
        if not ok:
            raise EngineError(value)
        return value

    def request(self, cmd: str, wait_s: float = 300.0, **kwargs):
        """Sends ``cmd(**kwargs)`` to the child and waits at most ``wait_s`` for its answer."""
        self._conn.send((cmd, kwargs))
        return self._wait(wait_s, cmd)

    def generate(self, prompt_ids: list[int], max_tokens: int, timeout: float = 120.0, lora: bool = False
                 ) -> list[int]:
        return self.request("generate", timeout, prompt_ids=prompt_ids, max_tokens=max_tokens, lora=lora)

    def update(self, version: int | str = "latest", timeout: float = 300.0) -> dict:
        return self.request("update", timeout + 30, version=version, timeout=timeout)

    def rpc(self, method: str, timeout: float = 60.0, **kwargs):
        return self.request("rpc", timeout, method=method, **kwargs)

    def close(self, timeout: float = 60.0) -> None:
        descendants = self._descendants()
        if self._proc.is_alive():
            try:
                self.request("close", timeout)
            except (EngineError, TimeoutError, OSError, EOFError) as e:
                logger.warning("engine %s did not close cleanly: %s", self.spec.worker, e)
            self._proc.join(timeout)
        if self._proc.is_alive():
            self.kill()
        _reap(descendants)

    def kill(self) -> None:
        descendants = self._descendants()
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(10)
        _reap(descendants)

    def _descendants(self) -> list:
        """The child's own children (at TP>1 vLLM's EngineCore and its workers), found while it is alive:
        once the child is gone they are re-parented and can no longer be told apart from strangers."""
        try:
            return psutil.Process(self._proc.pid).children(recursive=True) if self._proc.is_alive() else []
        except psutil.Error:
            return []

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def running_engines(specs: list[EngineSpec], start_timeout_s: float = 300.0) -> Iterator[list[EngineProcess]]:
    """The engines of ``specs``, started at once, in that order; all closed on exit. When one fails to start,
    the others are closed and its error is raised. An engine's start is mostly its own process's imports and
    model set-up, so on a machine with an idle core two starts overlap instead of adding up."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, len(specs)), thread_name_prefix="tensorhub-engine-start") as pool:
        futures = [pool.submit(EngineProcess, spec, start_timeout_s) for spec in specs]
    started, failures = [], []
    for future in futures:
        try:
            started.append(future.result())
        except Exception as e:  # noqa: BLE001 - the first is raised once every started engine is closed
            failures.append(e)
    try:
        if failures:
            raise failures[0]
        yield started
    finally:
        for engine in reversed(started):
            engine.close()


__all__ = ["ENGINE_ENV", "EngineError", "EngineProcess", "EngineSpec", "engine_kwargs", "load_checkpoint", "move_weights",
           "running_engines"]
