"""An engine shard's staging memory: where a pull lands while the engine keeps generating.

It owns every buffer the shard holds besides its parameters: a copy in the engine's layout (a raw pull, or a TP
rank's slices of 'hf'), one set of HF tensors (a staged 'hf' pull), and scratch for HF tensors the engine does
not use. On a CUDA engine host staging is page-locked, so that the copy into the parameters in the pause runs
at the link's speed and the data plane reads into it without a bounce through pageable memory.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec, dtype_from_name, dtype_name


class Staging:
    def __init__(self, staging: str, engine_device: torch.device, staging_device: str | torch.device | None):
        self.device = torch.device(staging_device or engine_device) if staging == "gpu" else torch.device("cpu")
        self.pinned = self.device.type == "cpu" and engine_device.type == "cuda" and torch.cuda.is_available()
        self._engine: dict[str, torch.Tensor] | None = None
        self._hf: dict[str, dict[str, torch.Tensor]] = {}
        self._scratch: dict[str, torch.Tensor] = {}

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A buffer on the staging device (pinned host memory when the engine is on CUDA)."""
        return torch.empty(tuple(shape), dtype=dtype, device=self.device, pin_memory=self.pinned)

    def engine_copy(self, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Buffers shaped like the parameters (allocated once, reused by every later pull)."""
        if self._engine is None:
            self._engine = {n: self.empty(t.shape, t.dtype) for n, t in params.items()}
        return self._engine

    def hf_set(self, manifest: Manifest) -> dict[str, torch.Tensor]:
        """Buffers for every HF tensor of ``manifest``: one set at a time, reused while the tensors stay alike."""
        key = manifest.digest
        if key not in self._hf:
            self._hf.clear()
            self._hf[key] = {t.name: self.empty(t.shape, dtype_from_name(t.dtype)) for t in manifest.tensors}
        return self._hf[key]

    def scratch(self, spec: TensorSpec) -> torch.Tensor:
        """A place to land HF tensor ``spec`` that the engine does not use (kept for the next version)."""
        buf = self._scratch.get(spec.name)
        if buf is None or tuple(buf.shape) != spec.shape or dtype_name(buf.dtype) != spec.dtype:
            buf = self.empty(spec.shape, dtype_from_name(spec.dtype))
            self._scratch[spec.name] = buf
        return buf

    @property
    def extra_bytes(self) -> int:
        """Bytes of every buffer held here, for memory reports."""
        sets = [self._engine or {}, self._scratch, *self._hf.values()]
        return sum(t.numel() * t.element_size() for bufs in sets for t in bufs.values())


__all__ = ["Staging"]
