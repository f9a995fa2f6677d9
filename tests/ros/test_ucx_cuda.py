"""What UCX needs to move CUDA memory (``ros/planes/ucx_cuda.py``), and the NIXL plane refusing to register CUDA
memory without it, before anything is registered. No GPU here: the plane is handed a CPU tensor that it is told
is CUDA memory; the check runs before any NIXL call, so the real agent never sees it."""

from __future__ import annotations

import pytest
import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.planes import base
from tensorhub_verl.ros.planes.nixl import NixlPlane
from tensorhub_verl.ros.planes.ucx_cuda import cuda_memory_problems, missing_libraries, tls_problem


@pytest.mark.parametrize("value", [None, "", "all", "cuda_copy,cuda_ipc,tcp", "cuda,sm,self", "tcp,cuda_copy",
                                   "^rc", "^cuda_ipc"])
def test_transport_lists_that_keep_a_cuda_transport_pass(value):
    assert tls_problem(value) is None


@pytest.mark.parametrize("value, named", [("tcp", "names no CUDA transport"), ("tcp,sm,self", "cuda_copy,cuda_ipc"),
                                          ("cuda_ipc,tcp", "names no CUDA transport"),
                                          ("^cuda", "excludes cuda"), ("^tcp,cuda_copy", "excludes cuda_copy")])
def test_transport_lists_without_one_are_named_with_the_fix(value, named):
    problem = tls_problem(value)
    assert problem is not None and named in problem and f"UCX_TLS={value}" in problem


def test_missing_driver_libraries_are_named_with_the_loaders_reason():
    def load(name):
        if name == "libnvidia-ml.so.1":
            raise OSError(f"{name}: cannot open shared object file")
        return object()

    assert missing_libraries(load) == ["libnvidia-ml.so.1 (libnvidia-ml.so.1: cannot open shared object file)"]
    problems = cuda_memory_problems("tcp", load)
    assert len(problems) == 2 and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in problems[1]
    assert cuda_memory_problems(None, lambda name: object()) == []


def test_the_nixl_plane_refuses_cuda_memory_it_cannot_move_and_registers_nothing(monkeypatch):
    plane = NixlPlane("ucx-cuda-check")
    try:
        real = base.Region.of_tensor
        monkeypatch.setattr(base.Region, "of_tensor",
                            classmethod(lambda cls, t: base.Region(t.data_ptr(), t.nbytes, 0, "VRAM")))
        monkeypatch.setenv("UCX_TLS", "tcp")
        with pytest.raises(errors.ConfigError, match="cannot register CUDA memory: UCX_TLS=tcp names no CUDA"):
            plane.register([torch.zeros(1024)])
        assert plane._registered == []
        monkeypatch.setattr(base.Region, "of_tensor", real)
        assert plane.register([torch.zeros(1024)])  # host memory: no CUDA check
    finally:
        plane.close()


def test_agents_get_cuda_ipc_reads_unless_the_environment_says_otherwise(monkeypatch):
    """UCX 1.23 turns cuda_ipc's GET off where GPUs have no NVLink, and every read here is a GET: without the
    setting a READ of another process's GPU memory falls back to TCP through host memory (seen on one H200)."""
    from tensorhub_verl.ros.planes.nixl import ucx_environment

    monkeypatch.delenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", raising=False)
    assert ucx_environment(None, cuda=True)["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y"
    # Without a GPU UCX has no CUDA module and would warn that the setting is unused.
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in ucx_environment(None, cuda=False)
    monkeypatch.setenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "n")
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in ucx_environment("lo", cuda=True)
    assert ucx_environment("lo", cuda=True)["UCX_NET_DEVICES"] == "lo"
