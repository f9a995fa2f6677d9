"""Starts one vLLM CPU engine holder beside an embedded hub and prints how long each phase takes.

    PYTHONPATH=$PWD python scripts/engine_start.py
"""
import sys, time, tempfile
t0 = time.monotonic()
from tensorhub_verl.bench.tiny_model import build_tiny_model
import tensorhub_verl as th
from tensorhub_verl.vllm.engine_proc import EngineProcess, EngineSpec
if __name__ == '__main__':
    d = build_tiny_model(tempfile.mkdtemp() + "/q", arch="qwen2", bpe_vocab=300, seed=1)
    hub = th.start_hub(host="127.0.0.1", port=0)
    print(f"{time.monotonic()-t0:6.1f} parent ready", flush=True)
    t1 = time.monotonic()
    e = EngineProcess(EngineSpec(model_dir=str(d), hub_url=hub.url, worker="e1"))
    print(f"{time.monotonic()-t1:6.1f} engine up; child's own startup_s (after imports) {e.startup}", flush=True)
    t2 = time.monotonic(); e.close(); print(f"{time.monotonic()-t2:6.1f} closed", flush=True)
    hub.stop()
