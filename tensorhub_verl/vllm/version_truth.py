"""Per-request weight-version spans on vLLM 0.31, whose engine does not report them (vLLM 0.33 does:
``CompletionOutput.weight_versions``). Installed in every vLLM process by the ``vllm.general_plugins`` entry
point (``plugin.py``); each hook acts only in the process that has what it wraps.

Where the truth is recorded: the engine core process, where the weights change. vLLM runs a
``collective_rpc`` between two engine steps, so when ``th_apply`` returns there, every request the scheduler
holds has exactly the output tokens the old weights sampled; its count is the request's boundary. That holds
when no batch is in flight during the call: an engine that runs one step at a time, or one paused for the
apply (verl's updater pauses each replica). With vLLM's async scheduling and no pause, a batch scheduled
before the call may still run; its tokens would count for the new version.

    front-end (AsyncLLM)                     engine core (one per process)
    generate(rid) ─────── add_request ─────► ledger.admit(rid)            (the version served now)
    collective_rpc("th_apply") ────────────► worker applies v ─► ledger.apply(v, {rid: output tokens so far})
    RequestOutput.outputs[0].weight_versions ◄── final EngineCoreOutput carries the request's record
                                                 (first version, [(position, version), ...])

The record rides on the final ``EngineCoreOutput.kv_transfer_params`` under ``RECORD_KEY`` (the one
free-form field vLLM 0.31 carries from the engine core to the front-end); the front-end takes it out again
before ``RequestOutput`` is built, turns it into ``WeightVersionSpan`` s with the request's output length,
sets them on each ``CompletionOutput`` as ``weight_versions`` and keeps them for ``take_spans`` (verl's server
reads them by request id). Engines never updated through TensorHub record nothing and change nothing.
Supported: vLLM 0.31 (``SUPPORTED``); on other versions the hooks are not installed and a warning says so.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from tensorhub_verl.vllm.version_spans import VersionLedger, WeightVersionSpan, spans_from_boundaries

logger = logging.getLogger("tensorhub_verl.vllm.version_truth")

SUPPORTED = ("0.31.",)
RECORD_KEY = "tensorhub_weight_versions"
APPLY_METHODS = ("th_apply",)
"""Extension methods after which the engine serves the version their ``ApplyResult`` names."""
STATUS_METHODS = ("th_setup", "th_status")
"""Extension methods answering ``HolderStatus``: an engine that serves a version the ledger does not know (its
first, or one applied by a rejoin after sleep) is recorded as serving it from then on."""

ENGINE_LEDGER = VersionLedger()
"""The ledger of the engine core in this process (vLLM runs one engine core per process)."""

_taken_lock = threading.Lock()
_front_spans: OrderedDict[str, list[WeightVersionSpan]] = OrderedDict()
_FRONT_MAX = 1 << 14


def take_spans(request_id: str) -> list[WeightVersionSpan] | None:
    """The spans of a finished request of this process's engine, by the request id given to ``generate``
    (None: none were recorded), and forgets them."""
    with _taken_lock:
        return _front_spans.pop(request_id, None)


def _keep_spans(request_id: str, spans: list[WeightVersionSpan]) -> None:
    with _taken_lock:
        _front_spans[request_id] = spans
        while len(_front_spans) > _FRONT_MAX:
            _front_spans.popitem(last=False)


# ---------------------------------------------------------------------------------------- engine core side
def _served_versions(method: str, results) -> set[int]:
    from tensorhub_verl.vllm.results import ApplyResult, HolderStatus

    out = set()
    for r in results or ():
        try:
            if method in APPLY_METHODS:
                out.add(ApplyResult.from_wire(r).version)
            else:
                served = HolderStatus.from_wire(r).served
                if served is not None:
                    out.add(served)
        except Exception:  # noqa: BLE001 - an answer of another shape says nothing about versions
            continue
    return out


def record_from_rpc(ledger: VersionLedger, method, results, positions) -> None:
    """After ``collective_rpc(method)`` answered ``results``: records the apply it made, if any.
    ``positions()``: output tokens of every request in the scheduler now."""
    if not isinstance(method, str) or not method.startswith("th_"):
        return
    ledger.enable()  # the engine is driven by TensorHub: record from now on
    if method not in APPLY_METHODS + STATUS_METHODS:
        return
    versions = _served_versions(method, results)
    if len(versions) != 1:
        if len(versions) > 1:
            logger.error("engine ranks report different versions %s after %s; not recorded", versions, method)
        return
    (version,) = versions
    # A status naming another version than the ledger's means the engine changed version where no th_apply
    # was seen (a rejoin after sleep): recorded at this status, the first moment this process can know it.
    if version != ledger.version:
        ledger.apply(version, positions())
        logger.info("engine serves v%d from now on (%d requests in flight)", version, ledger.in_flight)


def _install_engine_core(core_module, scheduler_module) -> None:
    cls = core_module.EngineCore
    if getattr(cls, "_tensorhub_truth", False):
        return
    add_request, collective_rpc = cls.add_request, cls.collective_rpc

    def add_request_recorded(self, request, request_wave: int = 0):
        ENGINE_LEDGER.admit(request.request_id)
        return add_request(self, request, request_wave)

    def collective_rpc_recorded(self, method, timeout=None, args=(), kwargs=None):
        results = collective_rpc(self, method, timeout, args, kwargs)
        record_from_rpc(ENGINE_LEDGER, method, results,
                        lambda: {rid: r.num_output_tokens for rid, r in self.scheduler.requests.items()})
        return results

    cls.add_request = add_request_recorded
    cls.collective_rpc = collective_rpc_recorded
    cls._tensorhub_truth = True
    # Every final output the engine core builds (finished, aborted, failed) is built through this name.
    real = core_module.EngineCoreOutput
    for module in (core_module, scheduler_module):
        module.EngineCoreOutput = _with_record(real)


def _with_record(real):
    def EngineCoreOutput(*args, **kwargs):  # noqa: N802 - stands in for the class at its call sites
        out = real(*args, **kwargs)
        if out.finish_reason is not None and ENGINE_LEDGER.active:
            record = ENGINE_LEDGER.finish_record(out.request_id)
            if record is not None:
                out.kv_transfer_params = {**(out.kv_transfer_params or {}), RECORD_KEY: record}
        return out

    return EngineCoreOutput


# ---------------------------------------------------------------------------------------- front-end side
def _install_front_end(output_module) -> None:
    cls = output_module.RequestState
    if getattr(cls, "_tensorhub_truth", False):
        return
    original = cls._new_request_output

    def _new_request_output(self, external_req_id, outputs, finished, kv_transfer_params=None,
                            ec_transfer_params=None):
        if kv_transfer_params and RECORD_KEY in kv_transfer_params:
            kv_transfer_params = dict(kv_transfer_params)
            first, boundaries = kv_transfer_params.pop(RECORD_KEY)
            detok = getattr(self, "detokenizer", None)
            n = detok.num_output_tokens() if detok is not None else max(
                (len(getattr(o, "token_ids", ())) for o in outputs), default=0)
            spans = spans_from_boundaries(first, [tuple(b) for b in boundaries], n)
            for o in outputs:
                if hasattr(o, "token_ids"):
                    o.weight_versions = spans
            _keep_spans(external_req_id, spans)
            kv_transfer_params = kv_transfer_params or None
        return original(self, external_req_id, outputs, finished, kv_transfer_params, ec_transfer_params)

    cls._new_request_output = _new_request_output
    cls._tensorhub_truth = True


def install() -> bool:
    """Installs both sides in this process (idempotent). False on a vLLM this was not written for."""
    from tensorhub_verl.vllm.compat import vllm_version

    version = vllm_version()
    if not version.startswith(SUPPORTED):
        logger.warning("vLLM %s: per-request weight versions are recorded only on vLLM %s; samples keep the "
                       "engine's own labels", version, ", ".join(v + "x" for v in SUPPORTED))
        return False
    from vllm.v1.core.sched import scheduler
    from vllm.v1.engine import core, output_processor

    _install_engine_core(core, scheduler)
    _install_front_end(output_processor)
    return True


__all__ = ["ENGINE_LEDGER", "RECORD_KEY", "install", "record_from_rpc", "take_spans"]
