"""verl 0.9.1: a sample's weight versions come from what its replica's engine recorded, not from verl's counter.

Why: verl labels each response with ``vLLMHttpServer.global_steps`` read after generation ends
(``vllm_async_server.py:689``), a counter set after each weight update. A response that straddles an update
gets the newer version, one from a replica that lags gets a version it never served, and fully_async's
``min_global_steps`` / ``max_global_steps`` (and its partial-rollout metrics) inherit that. With TensorHub each
engine records the version spans of every request (``tensorhub_verl.vllm.version_truth``); this patch makes
them the labels:

- ``vLLMHttpServer.generate``: the response's ``extra_fields`` get ``weight_versions`` (JSON list of
  ``[version, start, end]``, output tokens ``[start, end)``), ``min_global_steps`` / ``max_global_steps`` (the
  first and the last version that produced tokens) and ``global_steps`` (the last).
- ``FullyAsyncLLMServerClient.generate`` (a partial rollout resumed after an abort, one engine request per
  part): the spans of every part, offset by the tokens before it, and the label of the whole. Its audit line
  names each part's engine request id (``_vllm_request_id``), as the server's audit line does.
- ``vLLMHttpServer.set_global_steps`` (called by the updater inside a replica's pause, after its apply): with
  ``tensorhub.version_audit_dir`` set, one audit line per switch of the version the replica serves; the gate's
  hold and release get one line each, and each response's line says when its request passed the gate.
- Staleness bound (``tensorhub.max_version_lag``): ``th_hold_admission`` closes the server's submission gate
  without aborting anything (requests in flight finish; new ones wait at verl's gate, counted as held back)
  and reopens it; verl's own ``open_submission_gate`` (after every weight update) keeps a held gate closed.

Guard: each replacement takes verl's path unless the job selects ``checkpoint_engine.backend == 'tensorhub'``;
a response whose engine recorded no spans keeps verl's labels. Written for verl 0.9.1 on vLLM 0.31.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import logging
import os
import time

from tensorhub_verl.verl.patches.guards import engine_uses_tensorhub, job_uses_tensorhub
from tensorhub_verl.verl.patches.replace import replace_once

logger = logging.getLogger("tensorhub_verl.verl.patches.version_labels")

VERL_VERSIONS = ("0.9.1",)
SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
CLIENT = "verl.workers.rollout.llm_server"
TARGETS = (SERVER, CLIENT)
SPANS_KEY = "weight_versions"
"""The ``extra_fields`` key of a response's spans (a JSON string: numpy keeps it one object per sample)."""

_parts: contextvars.ContextVar[list | None] = contextvars.ContextVar("tensorhub_version_parts", default=None)
"""Within one resumed response: ``(spans, tokens)`` of each engine request, in order."""
_part_ids: contextvars.ContextVar[list | None] = contextvars.ContextVar("tensorhub_version_part_ids", default=None)
"""Within one resumed response: the engine request id of each part (what the server's audit names it by)."""


def describe() -> str:
    return ("responses are labelled (global_steps, min/max_global_steps, weight_versions) from the version spans "
            "their engine recorded; th_hold_admission holds a stale replica's gate")


def relabel(extra_fields: dict, spans, counter=None) -> None:
    """Sets a response's labels from its spans. A bound whose version is unknown (the engine's initial weights,
    never published) keeps ``counter`` (verl's own value)."""
    from tensorhub_verl.vllm.version_spans import label, to_wire

    first, last = label(spans)
    extra_fields[SPANS_KEY] = json.dumps(to_wire(spans))
    extra_fields["min_global_steps"] = counter if first is None else first
    extra_fields["max_global_steps"] = counter if last is None else last
    extra_fields["global_steps"] = extra_fields["max_global_steps"]


def _tensorhub_config(checkpoint_engine):
    from tensorhub_verl.verl.updater import config_from_engine_config

    return config_from_engine_config(checkpoint_engine)


def _audit(directory: str | None, kind: str, record: dict) -> None:
    """One JSON line in ``<directory>/<kind>-<pid>.jsonl`` (the process's own file: no interleaving)."""
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{kind}-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps({"time": time.time(), **record}) + "\n")


# ------------------------------------------------------------------------------------------------- server
def _server_uses_tensorhub(server) -> bool:
    return engine_uses_tensorhub(getattr(getattr(server, "config", None), "checkpoint_engine", None))


def _audit_dir(server) -> str | None:
    cached = getattr(server, "_tensorhub_audit_dir", False)
    if cached is False:
        cached = _tensorhub_config(server.config.checkpoint_engine).version_audit_dir
        server._tensorhub_audit_dir = cached
    return cached


def _patch_server(module) -> bool:
    cls = module.vLLMHttpServer

    def wrap_generate(original):
        signature = inspect.signature(original)

        async def generate(self, *args, **kwargs):
            request_id = signature.bind(self, *args, **kwargs).arguments["request_id"]
            try:
                out = await original(self, *args, **kwargs)
            finally:
                admitted = getattr(self, "_tensorhub_admitted", {}).pop(request_id, None)
            if not _server_uses_tensorhub(self):
                return out
            from tensorhub_verl.vllm.version_spans import to_wire
            from tensorhub_verl.vllm.version_truth import take_spans

            spans = take_spans(request_id)
            if spans is None:
                return out
            counter = self.global_steps
            relabel(out.extra_fields, spans, counter)
            _audit(_audit_dir(self), f"server-replica{self.replica_rank}",
                   {"request_id": request_id, "replica": self.replica_rank, "spans": to_wire(spans),
                    "tokens": len(out.token_ids), "min": out.extra_fields["min_global_steps"],
                    "max": out.extra_fields["max_global_steps"], "counter": counter, "admitted": admitted})
            return out

        generate.__signature__ = signature
        return generate

    def wrap_park(original):
        async def _park_until_admitted(self, request_id):
            if getattr(self, "_tensorhub_hold", False) and self._submission_paused:
                self._tensorhub_held_back = getattr(self, "_tensorhub_held_back", 0) + 1
            rejected = await original(self, request_id)
            if rejected is None and _server_uses_tensorhub(self) and _audit_dir(self):
                # when the request passed the gate, for the audit line of its response
                if not hasattr(self, "_tensorhub_admitted"):
                    self._tensorhub_admitted = {}
                self._tensorhub_admitted[request_id] = time.time()
            return rejected

        return _park_until_admitted

    def wrap_open(original):
        async def open_submission_gate(self):
            if getattr(self, "_tensorhub_hold", False):
                return  # held for staleness: th_hold_admission(False) opens it once a newer version is applied
            return await original(self)

        return open_submission_gate

    def add_hold(_missing):
        async def th_hold_admission(self, hold: bool) -> dict:
            """Holds (True) or releases (False) new requests at this server's gate; requests in flight go on.
            Returns ``{"held", "held_back"}``: requests that met the held gate since the previous call."""
            held_back, self._tensorhub_held_back = getattr(self, "_tensorhub_held_back", 0), 0
            was = getattr(self, "_tensorhub_hold", False)
            self._tensorhub_hold = bool(hold)
            if hold:
                self._submission_paused = True
                self._resume_event.clear()
            elif was:
                await self.open_submission_gate()
            directory = _audit_dir(self) if _server_uses_tensorhub(self) else None
            if directory:
                _audit(directory, f"hold-replica{self.replica_rank}",
                       {"replica": self.replica_rank, "held": bool(hold), "held_back": held_back})
            return {"held": bool(hold), "held_back": held_back}

        return th_hold_admission

    def wrap_set_steps(original):
        async def set_global_steps(self, global_steps: int):
            out = await original(self, global_steps)
            directory = _audit_dir(self) if _server_uses_tensorhub(self) else None
            if directory:
                # The updater calls this inside the replica's pause, after the apply: from here on the
                # replica serves ``global_steps`` (the audit of what the fleet served when).
                _audit(directory, f"serving-replica{self.replica_rank}",
                       {"replica": self.replica_rank, "version": global_steps})
            return out

        return set_global_steps

    changed = replace_once(cls, "generate", wrap_generate)
    changed = replace_once(cls, "set_global_steps", wrap_set_steps) or changed
    changed = replace_once(cls, "_park_until_admitted", wrap_park) or changed
    changed = replace_once(cls, "open_submission_gate", wrap_open) or changed
    if not hasattr(cls, "th_hold_admission"):
        cls.th_hold_admission = add_hold(None)
        changed = True
    return changed


# ------------------------------------------------------------------------------------------------- client
def _patch_client(module) -> bool:
    base, resuming = module.LLMServerClient, module.FullyAsyncLLMServerClient

    def wrap_part(original):
        async def generate(self, request_id, **kwargs):
            out = await original(self, request_id, **kwargs)
            parts = _parts.get()
            if parts is not None:
                parts.append((out.extra_fields.get(SPANS_KEY), len(out.token_ids)))
            return out

        return generate

    def wrap_request_id(original):
        def _vllm_request_id(self, request_id):
            engine_request_id = original(self, request_id)
            ids = _part_ids.get()
            if ids is not None:
                ids.append(engine_request_id)
            return engine_request_id

        return _vllm_request_id

    def wrap_whole(original):
        async def generate(self, request_id, **kwargs):
            if not job_uses_tensorhub(getattr(self, "config", None)):
                return await original(self, request_id, **kwargs)
            from tensorhub_verl.vllm.version_spans import concat, from_wire, to_wire

            token, ids_token = _parts.set([]), _part_ids.set([])
            try:
                out = await original(self, request_id, **kwargs)
                parts, ids = _parts.get(), _part_ids.get()
            finally:
                _parts.reset(token)
                _part_ids.reset(ids_token)
            if not parts or any(spans is None for spans, _ in parts):
                return out  # an engine that recorded nothing: verl's labels stay
            spans = concat([from_wire(s) for s, _ in parts], [n for _, n in parts])
            relabel(out.extra_fields, spans, out.extra_fields.get("global_steps"))
            engine = self.config.actor_rollout_ref.rollout.checkpoint_engine
            _audit(_tensorhub_config(engine).version_audit_dir, "client",
                   {"request_id": str(request_id), "parts": [[json.loads(s), n] for s, n in parts],
                    "engine_requests": ids if len(ids) == len(parts) else None,
                    "spans": to_wire(spans), "tokens": len(out.token_ids),
                    "min": out.extra_fields["min_global_steps"], "max": out.extra_fields["max_global_steps"]})
            return out

        return generate

    changed = replace_once(base, "generate", wrap_part)
    changed = replace_once(base, "_vllm_request_id", wrap_request_id) or changed
    return replace_once(resuming, "generate", wrap_whole) or changed


def apply(module) -> bool:
    if module.__name__ == SERVER:
        return _patch_server(module)
    return _patch_client(module)
