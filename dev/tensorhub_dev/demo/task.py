"""The toy RL task of the main job: a tiny model learns to answer in digits.

Everything is built locally in seconds, nothing is downloaded:
- a tiny random Qwen2 (``tensorhub_verl.bench.tiny_model``) with a chat template on its tokenizer (verl
  applies the chat template to every prompt);
- train/val parquet files in verl's RL dataset format (``prompt`` as chat messages, ``data_source``,
  ``reward_model.ground_truth``);
- a verifiable reward, ``reward.compute_score``: the fraction of the response's characters that are digits.

A random model writes digits in ~5% of its characters; GRPO raises that within a few dozen steps, so the
reward visibly rises. verl loads the reward by file path (``reward.custom_reward_function.path``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

DATA_SOURCE = "tensorhub_digits"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_WORDS = ("fox", "dog", "weights", "trainer", "rollout", "holder", "version", "policy", "chunk", "reader")


@dataclass(frozen=True, slots=True)
class ModelSize:
    """The tiny model's sizes (``tensorhub demo --model-size HIDDEN,INTERMEDIATE,LAYERS``): the default is
    ~1.5 MB of float32 a copy; at a larger one the copies' transfer, not the engines' pause, dominates a
    step's stall."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2

    HEADS = 4
    """Attention heads (2 KV heads); head_dim = hidden_size / 4 must be one vLLM's attention supports."""

    def __post_init__(self) -> None:
        from tensorhub_verl.errors import ConfigError

        head_dim = self.hidden_size // self.HEADS
        if self.hidden_size % self.HEADS or head_dim < 32 or head_dim & (head_dim - 1):
            raise ConfigError(f"--model-size: hidden_size / {self.HEADS} must be a power of two >= 32 "
                              f"(vLLM's attention head sizes), got hidden_size {self.hidden_size}; "
                              f"e.g. 128, 256, 512, 1024")
        if self.intermediate_size < 1 or self.num_layers < 1:
            raise ConfigError(f"--model-size: intermediate_size and layers must be >= 1, got {self}")

    @classmethod
    def parse(cls, text: str) -> "ModelSize":
        """``"512,1536,4"``: hidden_size, intermediate_size, layers."""
        from tensorhub_verl.errors import ConfigError

        try:
            hidden, intermediate, layers = (int(part) for part in text.split(","))
        except ValueError:
            raise ConfigError(f"--model-size takes HIDDEN,INTERMEDIATE,LAYERS (e.g. 512,1536,4), "
                              f"got {text!r}") from None
        return cls(hidden, intermediate, layers)

    @property
    def dir_name(self) -> str:
        """The model's directory in the task: ``model`` at the default size, else one per size."""
        if self == ModelSize():
            return "model"
        return f"model-{self.hidden_size}x{self.intermediate_size}x{self.num_layers}"

    def spec(self, seed: int):
        from tensorhub_verl.bench.tiny_model import TinyModelSpec

        return TinyModelSpec(arch="qwen2", hidden_size=self.hidden_size,
                             intermediate_size=self.intermediate_size, num_layers=self.num_layers,
                             num_heads=self.HEADS, num_kv_heads=2, seed=seed, init_std=0.02)


@dataclass(frozen=True, slots=True)
class TaskFiles:
    model_dir: Path
    train_file: Path
    val_file: Path
    reward_file: Path


def _prompts(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        words = " ".join(rng.choice(_WORDS) for _ in range(3))
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{words}: answer with digits"}],
            "ability": "digits",
            "reward_model": {"style": "rule", "ground_truth": "digits"},
            "extra_info": {"index": i},
        })
    return rows


def build_task(out_dir: str | Path, *, train_prompts: int = 512, val_prompts: int = 16, seed: int = 0,
               size: ModelSize = ModelSize()) -> TaskFiles:
    """Writes the tiny model (of ``size``), the datasets and nothing else into ``out_dir`` (idempotent)."""
    import pandas as pd
    from transformers import AutoTokenizer

    from tensorhub_verl.bench.tiny_model import build_tiny_model

    out = Path(out_dir)
    model_dir = out / size.dir_name
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, size.spec(seed))
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(str(model_dir))
    train_file, val_file = out / "train.parquet", out / "val.parquet"
    pd.DataFrame(_prompts(train_prompts, seed)).to_parquet(train_file)
    pd.DataFrame(_prompts(val_prompts, seed + 1)).to_parquet(val_file)
    return TaskFiles(model_dir=model_dir, train_file=train_file, val_file=val_file,
                     reward_file=Path(__file__).with_name("reward.py"))


def main(argv: list[str] | None = None) -> int:
    """``tensorhub demo prepare --out DIR``: builds the task and prints its paths as shell variables."""
    import argparse

    parser = argparse.ArgumentParser(prog="tensorhub demo prepare", description=build_task.__doc__)
    parser.add_argument("--out", required=True)
    files = build_task(parser.parse_args(argv).out)
    print(f"MODEL_PATH={files.model_dir}\nTRAIN_FILE={files.train_file}\nVAL_FILE={files.val_file}\n"
          f"REWARD_FILE={files.reward_file}")
    return 0
