"""``tensorhub attach-vllm``: an elastic rollout node.

    tensorhub attach-vllm --hub URL --model-dir DIR [--model policy] [--port 8000]
                          [--location dc=..,rack=..,node=..] [--token T] [--worker ID] [--staging cpu|gpu|none]
                          [--delta auto|on|off] [-- extra vllm serve arguments]

1. starts a vLLM engine (vLLM's own AsyncLLM) from DIR's config and tokenizer with dummy weights;
2. fetches the newest published version of ``--model``: raw, in the engine's own layout, from peers that hold
   it (the ROS planner picks the nearest), or through vLLM's ``load_weights`` from the ``hf`` layout when no
   worker holds the engine's layout; then holds it (a peer for the next node);
3. serves vLLM's OpenAI-compatible HTTP API on ``--port`` (plus ``GET /tensorhub/status``);
4. follows each newer version as it is published: the pull runs while the engine keeps serving, the engine
   pauses only to copy it in.

``TENSORHUB_HUB`` / ``TENSORHUB_TOKEN`` serve wherever ``--hub`` / ``--token`` do. The HTTP socket is bound
before the engine starts and requests are answered only after the first version is applied.

A node never outlives its purpose: when the hub stays unreachable for ``--hub-lost-timeout`` seconds (its job
ended), the node shuts down as on SIGTERM, engine processes included (``--keep-serving-without-hub`` keeps
serving the last version instead, and says so). vLLM's engine core and workers are killed by the kernel if this
process dies outright (``process_group.exit_with_parent_if_asked``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import concurrent.futures
import logging
import os
import signal
import socket
import threading

from tensorhub_verl import errors
from tensorhub_verl.ros.wire.topology import Location
from tensorhub_verl.settings import STAGING_CHOICES
from tensorhub_verl.vllm.follow import Cancelled, Follower, FollowerState, HubWatch

logger = logging.getLogger("tensorhub_verl.vllm.attach")


def location_labels(text: str | None) -> dict[str, str] | None:
    """``--location`` as the labels the engine's ranks connect with (``Location.parse``'s CLI form); None
    when it is not given. Raises ConfigError on a malformed item or an unknown label."""
    return Location.parse(text).as_dict() if text else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorhub attach-vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--hub", default=os.environ.get("TENSORHUB_HUB"), help="hub URL (env TENSORHUB_HUB)")
    p.add_argument("--model-dir", required=True, help="directory with the model's config.json and tokenizer")
    p.add_argument("--model", default="policy", help="ROS model name (default: policy)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--location", default=None, help="dc=..,rack=..,node=..")
    p.add_argument("--token", default=os.environ.get("TENSORHUB_TOKEN"), help="hub token (env TENSORHUB_TOKEN)")
    p.add_argument("--ca-file", default=os.environ.get("TENSORHUB_CA_FILE"),
                   help="CA that signed an https hub's certificate (env TENSORHUB_CA_FILE)")
    p.add_argument("--allow-plain-http", action="store_true",
                   help="send the token to an http:// hub on another host in clear (a network you trust)")
    p.add_argument("--worker", default=None, help="worker id (default: vllm-<hostname>-<port>)")
    p.add_argument("--staging", default="cpu", choices=STAGING_CHOICES)
    from tensorhub_verl.ros.planes.factory import TRANSPORTS# on use: it imports the planes

    p.add_argument("--transport", default="auto", choices=TRANSPORTS,
                   help="data plane (default auto: NIXL with RDMA or a loopback hub, else TCP); it must match "
                        "the plane of the hub's other workers (the hub refuses another one and names it)")
    p.add_argument("--source-layout", default="auto", choices=("auto", "hf"),
                   help="auto: read a version in the engine's layout from peers that hold it, else the trainer's "
                        "'hf'; hf: always the trainer's layout (only its holders serve it)")
    p.add_argument("--delta", default="auto", choices=("auto", "on", "off"),
                   help="auto/on: serving version N-1, read N as the delta N-1 -> N where the trainer published one "
                        "and apply it in place, checked against N's digests (docs/deltas.md); off: full versions")
    p.add_argument("--first-version-timeout", type=float, default=600.0,
                   help="seconds to wait for a first published version")
    p.add_argument("--fetch-timeout", type=float, default=300.0)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest sequence served (default: what vLLM derives from the model's config)")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--hub-lost-timeout", type=_positive_seconds, default=120.0,
                   help="seconds the hub may stay unreachable before the node shuts down (default 120)")
    p.add_argument("--keep-serving-without-hub", action="store_true",
                   help="when the hub is lost, keep serving the last version instead of shutting down")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="after --: extra `vllm serve` arguments")
    return p


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def vllm_argv(ns: argparse.Namespace) -> list[str]:
    from tensorhub_verl.vllm import compat
    from tensorhub_verl.vllm.extension import EXTENSION_QUALNAME

    argv = ["--model", ns.model_dir, "--tokenizer", ns.model_dir, "--load-format", "dummy",
            "--worker-extension-cls", EXTENSION_QUALNAME, "--host", ns.host, "--port", str(ns.port),
            "--served-model-name", ns.model,
            *(["--max-model-len", str(ns.max_model_len)] if ns.max_model_len else []),
            "--tensor-parallel-size", str(ns.tensor_parallel_size)]
    if compat.is_cpu_platform():
        # vLLM's CPU build: no graphs to capture, and bf16 dies in its CPU attention. On GPUs vLLM's defaults
        # stand (CUDA graphs on, the model's dtype); pass --enforce-eager after -- to turn graphs off.
        argv += ["--enforce-eager", "--dtype", "float32"]
    extra = list(ns.vllm_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    return argv + extra


class Node:
    """One attached engine's ROS side: the follower and every rank's holder. ``leave`` is idempotent and runs
    before vLLM stops the engine (see ``compat.before_engine_shutdown``), so the hub drops this node's
    holdings at once instead of at its heartbeat timeout."""

    def __init__(self, updater, follower: Follower):
        self.updater = updater
        self.follower = follower
        self._left = threading.Lock()
        self._done = False

    def leave(self, timeout: float = 60.0) -> None:
        with self._left:
            if self._done:
                return
            self._done = True
            logger.info("leaving: stopping the follower and unpublishing this node's holdings")
            self.follower.close(timeout)
            try:
                self.updater.call("th_shutdown", timeout=timeout)
            except Exception as e:  # noqa: BLE001 - the hub drops us at our heartbeat timeout anyway
                logger.warning("could not unpublish cleanly (%s: %s); the hub drops this node at its heartbeat "
                               "timeout", type(e).__name__, e)


class LoopRpcError(errors.TensorHubError):
    """An engine RPC was called on the event loop's own thread (it would wait for itself)."""


def _loop_rpc(engine, loop: asyncio.AbstractEventLoop, loop_thread: int):
    """An ``updater.Rpc`` over ``AsyncLLM.collective_rpc`` for threads other than the loop's."""
    def rpc(method: str, kwargs: dict, timeout: float) -> list:
        if threading.get_ident() == loop_thread:
            raise LoopRpcError(f"engine RPC {method!r} called on the event loop thread")
        fut = asyncio.run_coroutine_threadsafe(engine.collective_rpc(method, timeout=timeout, kwargs=kwargs), loop)
        try:
            return fut.result(timeout + 10)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"engine RPC {method!r} gave no answer within {timeout + 10:.0f} s") from None
    return rpc


async def _serve(ns: argparse.Namespace) -> int:
    from fastapi import APIRouter

    from tensorhub_verl.vllm import compat
    from tensorhub_verl.vllm.engine_updater import EngineUpdater

    args = compat.openai_server_args(vllm_argv(ns))
    listen_address, sock = compat.openai_server_socket(args)
    worker = ns.worker or f"vllm-{socket.gethostname()}-{ns.port}"
    state = FollowerState(worker=worker, model=ns.model)
    router = APIRouter()

    @router.get("/tensorhub/status")
    def status() -> dict:
        return state.as_dict()

    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        try:
            engine = await stack.enter_async_context(compat.async_engine_client(args))
        except (ValueError, TypeError) as e:  # vLLM validates its config with pydantic (a ValueError)
            raise VllmRefused(str(e)) from e
        updater = EngineUpdater(_loop_rpc(engine, loop, threading.get_ident()))
        hub_tls = {"ca_file": ns.ca_file, "allow_plain_http": ns.allow_plain_http}
        watch = HubWatch(ns.hub, ns.model, ns.token, **hub_tls)
        follower = Follower(updater, watch, state, ns.fetch_timeout,
                            hub_lost_s=ns.hub_lost_timeout, on_hub_lost=_hub_lost_policy(ns))
        node = Node(updater, follower)
        # until vLLM's server installs its own handlers: SIGTERM/SIGINT cancel the wait for a first version
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, follower.cancel)
        try:
            await asyncio.to_thread(updater.setup, ns.hub, ns.model, worker, location_labels(ns.location),
                                    ns.token, ns.staging,
                                    {"tls_ca_file": ns.ca_file, "allow_plain_http": ns.allow_plain_http,
                                     "transport": ns.transport,
                                     # the job's key: NIXL holders serve only their own job (job_credentials)
                                     "job_key": os.environ.get("TENSORHUB_JOB_KEY") or None},
                                    ns.fetch_timeout, delta=ns.delta)
            # every engine RPC goes through this loop: blocking calls run on threads, never on the loop itself
            await asyncio.to_thread(follower.first_version, ns.first_version_timeout)
            if follower.stopping:
                raise Cancelled("stopped before serving")
            follower.start()
            compat.before_engine_shutdown(engine, node.leave)
            logger.info("ready: %s serves %s v%s on http://%s:%d (OpenAI API /v1/..., GET /tensorhub/status)",
                        worker, ns.model, state.as_dict().get("served"), ns.host, ns.port)
            shutdown = await compat.serve_openai(engine, listen_address, sock, args, router)
            await shutdown
        finally:
            await asyncio.to_thread(node.leave)
            sock.close()
    return 0


def _hub_lost_policy(ns: argparse.Namespace):
    """What a lost hub does to this node: a SIGTERM to itself (vLLM's orderly shutdown, as a user's Ctrl-C), or,
    with ``--keep-serving-without-hub``, nothing but the log line."""
    if ns.keep_serving_without_hub:
        return lambda: logger.warning("--keep-serving-without-hub: serving the last version until stopped")

    def shut_down() -> None:
        logger.error("shutting this node down: its hub is gone (--keep-serving-without-hub keeps it serving)")
        os.kill(os.getpid(), signal.SIGTERM)

    return shut_down


class VllmRefused(errors.TensorHubError):
    """vLLM rejected the engine configuration this node built (bad or incompatible arguments)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tensorhub attach-vllm``; returns the process exit code."""
    ns = build_parser().parse_args(argv)
    if not ns.hub:
        build_parser().error("--hub (or TENSORHUB_HUB) is required")
    try:
        location_labels(ns.location)
    except errors.ConfigError as e:
        build_parser().error(str(e))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tensorhub_verl.settings import SOURCE_LAYOUT_ENV

    if ns.source_layout == "hf":  # read in the engine's worker processes, which inherit this environment
        os.environ[SOURCE_LAYOUT_ENV] = "hf"
    from tensorhub_verl.process_group import EXIT_WITH_PARENT_ENV

    os.environ[EXIT_WITH_PARENT_ENV] = str(os.getpid())  # vLLM's engine processes go when this one goes
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # a level of our own: once serving, something in vLLM's server stack raises the root logger to ERROR
    pkg = logging.getLogger("tensorhub_verl")
    if pkg.level == logging.NOTSET:
        pkg.setLevel(os.environ.get("TENSORHUB_LOG_LEVEL", "INFO").upper())
    import uvloop

    try:
        return uvloop.run(_serve(ns))
    except KeyboardInterrupt:
        return 0
    except Cancelled:
        logger.info("attach-vllm stopped before it served a version")
        return 0
    except VllmRefused as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip() and "errors.pydantic.dev" not in line]
        first = next((line for line in lines if line.startswith("Value error")), " / ".join(lines[:2]))
        logger.error("vLLM refused its configuration: %s\n  fix: change the vLLM arguments this node passes "
                     "(--max-model-len must not exceed the model's own maximum; by default it is derived from the "
                     "model; --tensor-parallel-size; extra `vllm serve` arguments after --)", first)
        return 2
    except (errors.TensorHubError, TimeoutError) as e:
        logger.error("attach-vllm failed: %s: %s", type(e).__name__, e)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
