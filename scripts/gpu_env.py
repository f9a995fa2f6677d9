"""What the GPU paths will run on, read from the process itself: the GPU, driver, torch and its CUDA, the NIXL build
and the UCX it loads, where libcuda, libnvidia-ml and libcudart come from, and what keeps UCX from moving CUDA
memory (``tensorhub_verl.ros.planes.ucx_cuda``).

    python scripts/gpu_env.py [--device cuda|cpu]

Builds one NIXL agent with its UCX backend (UCX loads its transport modules then) and, on CUDA, registers a small
CUDA buffer with it, then lists the shared libraries this process mapped. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WATCHED = ("libcuda.so", "libnvidia-ml.so", "libcudart.so", "libucp", "libuct_cuda", "libucm_cuda", "libuct_cma",
           "libplugin_UCX", "libnixl")
DISTRIBUTIONS = ("torch", "numpy", "nixl-cu13", "nixl-cu12", "fastapi", "starlette", "pydantic", "pydantic-core",
                 "uvicorn", "httptools", "anyio", "zstandard", "typing-extensions", "xxhash", "httpx", "psutil",
                 "prometheus-client", "pytest", "pytest-timeout", "transformers", "vllm", "verl", "ray")


def mapped_libraries() -> dict[str, list[str]]:
    """For each watched name, the files this process has mapped whose name contains it."""
    paths = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            paths.add(parts[5])
    return {w: sorted(p for p in paths if w in Path(p).name) for w in WATCHED}


def ucx_version(libucp: list[str]) -> str | None:
    if not libucp:
        return None
    try:
        fn = ctypes.CDLL(libucp[0]).ucp_get_version_string
        fn.restype = ctypes.c_char_p
        return fn().decode()
    except (OSError, AttributeError) as e:
        return f"unknown ({e})"


def nvidia_smi() -> dict:
    if not shutil.which("nvidia-smi"):
        return {"found": False}
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return {"found": True, "rc": done.returncode, "gpus": done.stdout.strip().splitlines(),
                "stderr": done.stderr.strip()[-500:]}
    except subprocess.TimeoutExpired:
        return {"found": True, "error": "nvidia-smi gave no answer within 20 s"}


def versions() -> dict[str, str | None]:
    out = {}
    for name in DISTRIBUTIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    import torch

    env = {"python": sys.version.split()[0], "executable": sys.executable, "machine": platform.machine(),
           "cpus": os.cpu_count(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "cuda_available": torch.cuda.is_available(), "nvidia_smi": nvidia_smi(), "versions": versions(),
           "environment": {k: v for k, v in os.environ.items()
                           if k.startswith(("UCX_", "NIXL_", "CUDA_", "NVIDIA_")) or k == "LD_LIBRARY_PATH"},
           "find_library": {n: ctypes.util.find_library(n) for n in ("cuda", "nvidia-ml", "cudart")}}
    if torch.cuda.is_available():
        torch.cuda.init()
        props = torch.cuda.get_device_properties(0)
        env["gpus"] = [{"name": torch.cuda.get_device_name(i), "capability": torch.cuda.get_device_capability(i),
                        "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                       for i in range(torch.cuda.device_count())]
        env["gpu0_sms"] = props.multi_processor_count
    from tensorhub_verl.ros.planes.ucx_cuda import cuda_memory_problems

    env["ucx_cuda_problems"] = cuda_memory_problems(os.environ.get("UCX_TLS"))
    try:
        from tensorhub_verl.ros.planes.nixl_build import nixl_api

        api = nixl_api()
        env["nixl_module"] = api.__name__.split(".")[0]
        env["nixl_file"] = getattr(sys.modules[env["nixl_module"]], "__file__", None)
        agent = api.nixl_agent("gpu-env", api.nixl_agent_config(backends=["UCX"]))
        env["nixl_backends"] = list(getattr(agent, "backends", {}) or [])
        if args.device == "cuda" and torch.cuda.is_available():
            buf = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
            try:
                agent.deregister_memory(agent.register_memory(buf))
                env["nixl_vram_registration"] = "ok"
            except Exception as e:  # the failure is the finding
                env["nixl_vram_registration"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # report what failed; the other fields still tell the story
        env["nixl_error"] = f"{type(e).__name__}: {e}"
    libs = mapped_libraries()
    env["loaded_libraries"] = libs
    env["ucx_version"] = ucx_version(libs["libucp"])
    env["ucx_cuda_module_loaded"] = bool(libs["libuct_cuda"])
    for key, value in env.items():
        if key not in ("versions", "environment", "loaded_libraries"):
            print(f"{key}: {value}")
    print(json.dumps(env, default=str))
    return 0 if "nixl_error" not in env and re.match(r"^(ok|)$", env.get("nixl_vram_registration", "")) else 1


if __name__ == "__main__":
    sys.exit(main())
