"""`tensorhub bench publish-cost`: what a row-shard publish at the hub's piece limit costs a hub process.

A hub process (`tensorhub hub`, ``bench.hub_proc``; without a token, which only admits registration) and an
owner trainer; an attacker with a registered worker id sends publishes of one row shard of a version cut into
``--pieces`` pieces (default ``HubLimits.max_shard_pieces``: 32 tensors x 65,536 row shards, one 128-byte chunk
per rank), in three ways: without the right worker credential, as a worker outside the model's owner job, and
as the owner itself, one new version after another (each leaves a pending shard group behind). Reported: the hub
process's CPU seconds (user + system, from psutil) and the answer each way got. Human summary, then one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import time

import psutil

from tensorhub_verl import errors
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.client.hub_client import HubClient
from tensorhub_verl.ros.hub.limits import HubLimits

TENSORS = 32


def piece_limit_publish(worker: str, version: int = 1, model: str = "policy", rank: int = 0,
                        pieces: int = HubLimits().max_shard_pieces) -> msg.Publish:
    """Row shard ``rank`` of a version of ``pieces`` pieces: ``TENSORS`` tensors of one float32 row per rank."""
    ranks = pieces // TENSORS
    tensors = [msg.TensorSpecMsg(name=f"t{i}", shape=[ranks], dtype="float32", nbytes=4 * ranks)
               for i in range(TENSORS)]
    digests = [""] * ranks
    digests[rank] = "0" * 16
    manifest = msg.ManifestMsg(model=model, version=version, layout="fsdp", tensors=tensors, chunk_bytes=4096,
                               chunk_digests=digests, row_shards=ranks)
    regions = [msg.RegionMsg(addr=1 << 20, offset=4 * rank, nbytes=4)] * TENSORS
    return msg.Publish(worker=worker, holder=worker, manifest=manifest, regions=regions, shard_group="ranks",
                       shard_count=ranks, shard_rank=rank)


def register(url: str, worker: str, job_key: str | None = None, token: str | None = None) -> HubClient:
    """A raw hub client registered as ``worker``: it sends that worker's credential with every call."""
    client = HubClient(url, token, request_timeout_s=120, retry_s=5, job_key=job_key)
    client.post(msg.REGISTER_PATH, msg.RegisterWorker(
        worker=worker, location=msg.LocationMsg(), agent_name=f"{worker}-agent", agent_metadata_b64="bWV0YQ=="),
        msg.WorkerAck)
    return client


def _attempt(hub: psutil.Process, client: HubClient, req: msg.Publish) -> tuple[float, float, str]:
    """(hub CPU seconds, wall seconds, answer) of one publish."""
    before, started = hub.cpu_times(), time.monotonic()
    try:
        client.post("/v1/publish", req, msg.OkReply)
        answer = "accepted"
    except errors.TensorHubError as e:
        answer = type(e).__name__
    after = hub.cpu_times()
    cpu = max(0.0, after.user + after.system - before.user - before.system)  # counters tick in 10 ms steps
    return cpu, time.monotonic() - started, answer


def run(attempts: int, pieces: int = HubLimits().max_shard_pieces) -> dict:
    hub = HubProcess().start()  # no token: per-worker credentials and owners hold without one
    try:
        process = psutil.Process(hub.pid)
        trainer = register(hub.url, "trainer", job_key="the-trainers-job")
        mallory = register(hub.url, "mallory")
        trainer.post("/v1/publish", piece_limit_publish("trainer", version=1, pieces=pieces),
                     msg.OkReply)  # binds the model
        results = {}
        ways = {
            "wrong_credential": lambda v: (mallory, piece_limit_publish("trainer", version=v, pieces=pieces)),
            "non_owner": lambda v: (mallory, piece_limit_publish("mallory", version=v, pieces=pieces)),
            "owner_new_versions": lambda v: (trainer, piece_limit_publish("trainer", version=v, pieces=pieces)),
        }
        for way, make in ways.items():
            rows = [_attempt(process, *make(100 + n)) for n in range(attempts)]
            results[way] = {"hub_cpu_s": [round(r[0], 3) for r in rows], "wall_s": [round(r[1], 3) for r in rows],
                            "answers": [r[2] for r in rows]}
        return {"pieces": pieces, "attempts": attempts, "ways": results,
                "hub_rss_mb": round(process.memory_info().rss / 2**20, 1)}
    finally:
        hub.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub bench publish-cost", description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=3, help="publishes of each kind")
    parser.add_argument("--pieces", type=int, default=HubLimits().max_shard_pieces,
                        help="tensors x row shards of each publish (a multiple of 32, at most 32 x 65,536)")
    args = parser.parse_args(argv)
    report = run(args.attempts, args.pieces)
    for way, row in report["ways"].items():
        print(f"{way:20s} hub CPU {sum(row['hub_cpu_s']):7.2f} s over {args.attempts} publishes "
              f"(each {row['hub_cpu_s']}), answers {row['answers']}")
    print(f"hub RSS at the end: {report['hub_rss_mb']} MB")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
