"""The update results cross vLLM's RPC as they are: pickled by the multiprocess executor, and through
``AsyncLLM``'s msgpack channel either as their dict (vLLM's default) or rebuilt (insecure serialization on).
``from_wire`` reads every form back to the same result, so a driver never reads a rank's answer by key."""

from __future__ import annotations

import pickle

import pytest

from tensorhub_verl import errors
from tensorhub_verl.vllm.results import (
    AdapterUpdate, ApplyResult, HolderStatus, PullStart, PullStatus, SleepStatus, UpdateResult,
)

pytestmark = pytest.mark.vllm

RANKS = [ApplyResult(worker="e/rank0", version=3, applied=True, source_layout="hf", stall_s=0.5, pull_s=1.0,
                     bytes=10, sources={"trainer": 6, "peer": 4}, phases={"copy_in_s": 0.2}, preserved_bytes=1),
         ApplyResult(worker="e/rank1", version=3, applied=True, source_layout="hf", stall_s=0.7, pull_s=0.9,
                     bytes=12, sources={"trainer": 12}, phases={"copy_in_s": 0.3}, peak_bucket_bytes=5)]
STATUSES = [HolderStatus(worker="e/rank0", served=2, layout="vllm/qwen2/tp1/rank0", staging="cpu", extra_bytes=8,
                         pull=PullStatus(version=3, state="pulling", source_layout="hf")),
            HolderStatus(worker=None, served=None, asleep=SleepStatus(served=2, level=1, weights_kept=True))]


@pytest.mark.parametrize("insecure", ["0", "1"])
def test_results_survive_the_async_engines_msgpack_channel(monkeypatch, insecure):
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", insecure)
    from vllm.v1.engine import EngineCoreOutputs, UtilityOutput
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder, UtilityResult

    sent = [*RANKS, PullStart(version=3, source_layout="hf", started=True), AdapterUpdate(version=2, applied=False),
            *STATUSES]
    out = EngineCoreOutputs(utility_output=UtilityOutput(call_id=1, result=UtilityResult(sent)))
    got = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(out)).utility_output.result
    got = getattr(got, "result", got)
    assert isinstance(got[0], dict if insecure == "0" else ApplyResult)
    assert [ApplyResult.from_wire(r) for r in got[:2]] == RANKS
    assert PullStart.from_wire(got[2]) == sent[2] and AdapterUpdate.from_wire(got[3]) == sent[3]
    statuses = [HolderStatus.from_wire(s) for s in got[4:]]
    assert statuses == STATUSES and statuses[0].pulling and not statuses[1].pulling  # nested statuses typed too


def test_results_pickle_and_merge_into_one_engine_update():
    assert pickle.loads(pickle.dumps(RANKS)) == RANKS
    res = UpdateResult.of_ranks(RANKS, seconds=2.0)
    assert (res.version, res.applied, res.stall_s, res.pull_s, res.bytes, res.rank_bytes) == (3, True, 0.7, 1.0, 22,
                                                                                              [10, 12])
    assert res.sources == {"trainer": 18, "peer": 4} and res.phases == {"copy_in_s": 0.3}
    assert (res.preserved_bytes, res.peak_bucket_bytes, res.source_layouts) == (1, 5, ["hf", "hf"])
    assert UpdateResult.from_wire(res.as_dict()) == res


def test_from_wire_refuses_what_is_no_result():
    with pytest.raises(errors.InvalidRequest, match="ApplyResult"):
        ApplyResult.from_wire([1, 2])
    with pytest.raises(errors.InvalidRequest, match="version"):
        ApplyResult.from_wire({"worker": "w"})  # a dict missing the fields every result has
