"""The trainer side of the vLLM tests: a tiny HF model stepped by toy_training_step, each step published."""

from __future__ import annotations

import copy

import torch

from tensorhub_verl.bench.tiny_model import hf_greedy, hf_state_dict, load_hf_model, toy_training_step

PROMPTS = [[84, 259, 221, 81, 85, 73, 17, 40], [5, 200, 31, 99, 150]]
N_NEW = 12


class ToyRun:
    """Publishes each step's HF weights as a version and keeps HF transformers' greedy references."""

    def __init__(self, model_dir: str, client):
        from transformers import AutoTokenizer

        self.model = load_hf_model(model_dir)
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.client = client
        self.refs: dict[int, list[list[int]]] = {}
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.models: dict[int, torch.nn.Module] = {}

    def step_and_publish(self, version: int, model: str = "policy") -> None:
        toy_training_step(self.model, self.tok, version)
        snap = copy.deepcopy(self.model)
        self.weights[version] = hf_state_dict(snap)
        self.client.publish(model, version, self.weights[version])
        self.refs[version] = [hf_greedy(snap, p, N_NEW) for p in PROMPTS]
        self.models[version] = snap
