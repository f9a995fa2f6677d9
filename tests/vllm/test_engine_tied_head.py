"""Real vLLM engines (CPU build, float32) serving the tiny Qwen2 (tied embeddings) from the trainer's real
``Publisher``: a version without ``lm_head.weight`` (the head left out, as the trainer publishes a tied model now)
serves the same log-probs, byte-identical weights and HF's greedy tokens as the same weights published with the
head (a publisher that keeps it), moves the embedding's bytes less, and its successors reach engines as deltas in
place, including an engine whose version came raw from its peer.

    trainer (this process): v1 with the head (begin without tie_word_embeddings), v2 the same weights without it,
                            v3 a few rows moved (embedding included), without it, with its delta from v2
    t1 (staging none, in place): v1 from 'hf' (head into scratch), v2 from 'hf' (no scratch), v3 as a delta
    t2 (staging cpu): v2 raw from t1, then v3 as a delta (no head, so no scratch to fill from the embedding)

The bucketed path (an engine without an in-place mapping) loads head-less versions in tests/vllm/test_architectures.py
(gemma2, tied: its versions are ``hf_state_dict``'s, which carry a tied weight once).
"""

from __future__ import annotations

import pytest
import torch

from tests.requires import require

require("vllm")

import tensorhub_verl as th
from tensorhub_verl.bench.tiny_model import greedy_mismatch, load_hf_model
from tensorhub_verl.hf_names import EMBEDDING, TIED_HEAD
from tensorhub_verl.ros.wire.integrity import tensor_digests
from tensorhub_verl.verl.digest import differing
from tensorhub_verl.verl.publisher import Publisher
from tensorhub_verl.vllm.engine_proc import EngineSpec, running_engines
from tensorhub_verl.vllm.layout import layout_name
from tests.vllm.conftest import loc
from tests.vllm.toy_run import N_NEW, PROMPTS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MODEL = "tpolicy"
LAYOUT = layout_name("qwen2", 1, 0)


class Trainer:
    """The tiny Qwen2 as verl exports it (``state_dict``: the embedding under both names, one tensor), published
    by the trainer's own ``Publisher``."""

    def __init__(self, model_dir: str, client):
        self.model = load_hf_model(model_dir)
        self.publisher = Publisher(client, model=MODEL, keep=2, staging="cpu", chunk_bytes=64 << 10,
                                   unpublish_timeout_s=30.0, delta="auto")
        self.client = client
        self.served: dict[int, dict[str, torch.Tensor]] = {}
        self.stats: dict = {}

    def publish(self, version: int, *, tied: bool):
        state = self.model.state_dict()
        assert state[TIED_HEAD].data_ptr() == state[EMBEDDING].data_ptr()
        self.publisher.begin(version, tie_word_embeddings=tied)
        for name, t in state.items():
            self.publisher.add(name, t)
        self.stats[version] = self.publisher.finish()
        self.served[version] = {n: t.detach().clone() for n, t in state.items() if n != TIED_HEAD}
        return self.stats[version]

    def step(self, version: int) -> None:
        """A few rows of the embedding (so of the tied head too) and of one projection move."""
        g = torch.Generator().manual_seed(version)
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"):
                rows = params[name][3 * version:3 * version + 3]
                rows += 0.5 * torch.randn(rows.shape, generator=g)

    @torch.no_grad()
    def logprobs(self, prompt: list[int]) -> list[float]:
        logits = self.model(input_ids=torch.tensor([prompt])).logits[0, :-1].double()
        return logits.log_softmax(-1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def rig(hub, tiny_models):
    client = th.connect(hub.url, worker="ttrainer", location=loc("trainer"), chunk_bytes=64 << 10)
    trainer = Trainer(tiny_models["qwen2"], client)
    try:
        with running_engines([
            EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker="t1", model=MODEL, location=loc("n1"),
                       staging="none"),
            EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker="t2", model=MODEL, location=loc("n2")),
        ]) as (t1, t2):
            yield trainer, t1, t2
    finally:
        trainer.publisher.close()
        client.close()


def logprobs(engine) -> list[list[float]]:
    return [engine.request("prompt_logprobs", 120, prompt_ids=p) for p in PROMPTS]


def serves_exactly(engine, trainer: Trainer, version: int) -> None:
    """The engine's weights, read back as HF tensors, are the trainer's of ``version`` (the embedding serving as
    the tied head); its greedy tokens are HF's (but for float rounding ties) and its log-probs HF's, within float32
    rounding."""
    answer = engine.rpc("th_hf_digests")[0]
    assert answer["version"] == version
    assert differing(tensor_digests(trainer.served[version]), answer["digests"], answer["unused"]) == []
    assert [greedy_mismatch(trainer.model, p, engine.generate(p, N_NEW)) for p in PROMPTS] == [None] * len(PROMPTS)
    for got, ref in zip(logprobs(engine), map(trainer.logprobs, PROMPTS)):
        assert got == pytest.approx(ref, abs=1e-3)


def test_a_version_without_the_tied_head_serves_what_the_version_with_it_serves(rig):
    trainer, t1, _ = rig
    with_head = trainer.publish(1, tied=False)
    without = trainer.publish(2, tied=True)
    m1, m2 = (trainer.client.manifest(MODEL, v) for v in (1, 2))
    assert TIED_HEAD in [t.name for t in m1.tensors] and TIED_HEAD not in [t.name for t in m2.tensors]
    embedding = trainer.served[1][EMBEDDING]
    assert with_head.left_out == () and without.left_out == (TIED_HEAD,)
    assert m2.nbytes == without.bytes == m1.nbytes - embedding.numel() * embedding.element_size()

    first = t1.update(1)
    assert first["applied"] and first["bytes"] == m1.nbytes
    serves_exactly(t1, trainer, 1)
    old = logprobs(t1)
    second = t1.update(2)  # the publisher's delta from v1 was refused (other tensors): v2 in full
    assert second["applied"] and second["delta_ranks"] == 0 and second["bytes"] == m2.nbytes
    serves_exactly(t1, trainer, 2)
    assert logprobs(t1) == old  # the same served logits, exactly
    assert t1.rpc("th_wait_published", timeout_s=60.0) == [True]


def test_deltas_of_head_less_versions_apply_in_place_also_over_a_base_read_raw_from_a_peer(rig):
    trainer, t1, t2 = rig
    joined = t2.update(2)
    assert joined["source_layouts"] == [LAYOUT] and set(joined["sources"]) == {"t1"}
    serves_exactly(t2, trainer, 2)

    trainer.step(3)
    published = trainer.publish(3, tied=True)
    assert published.left_out == (TIED_HEAD,) and 0 < published.delta_bytes < published.bytes / 4
    for engine in (t2, t1):
        res = engine.update(3)
        assert res["applied"] and res["delta_ranks"] == 1 and res["delta_fallbacks"] == 0, res
        assert res["bytes"] == res["delta_bytes"] == published.delta_bytes
        serves_exactly(engine, trainer, 3)
