"""The synchronous single-process GRPO baseline, and the briefly pretrained policy RL starts from.

`pretrained_policy` trains a small `TinyGPT` (`RL_MODEL_CONFIG`) on the default corpus for a
few hundred AdamW steps (well under a minute on one CPU core) and caches the weights under the
user cache directory, keyed by everything that determines them, so later calls load them.

`run_sync_grpo` is the reference loop the swarm is compared against: every step it draws
`groups_per_step` prompts (prompt seeds derived from the run seed and the step), samples
`group_size` completions of each with seeded sampling (`training.generation.generate`, no
proofs), scores them with the task and applies one `GRPOLearner` step. Its defaults
(`GRPOConfig()`, `LineLengthTask()`, `RL_MODEL_CONFIG`) are the hyper-parameters the swarm
trainer uses as well.

Both run with the caller's torch thread count; on a small shared machine one thread
(`torch.set_num_threads(1)`) is several times faster for a model this size.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from platformdirs import user_cache_dir

from training.causal_lm import CausalLM
from training.data import Corpus, DataConfig, load_corpus
from training.generation import generate
from training.grpo import GRPOConfig, GRPOLearner, GRPOStepReport, ScoredRollout
from training.model import ModelConfig, TinyGPT
from training.tasks import Task

__all__ = [
    "PRETRAIN_DATA",
    "RL_MODEL_CONFIG",
    "policy_cache_dir",
    "pretrained_policy",
    "rollout_seed",
    "run_sync_grpo",
]

logger = logging.getLogger(__name__)

RL_MODEL_CONFIG = ModelConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=128)
"""The RL policy's shape: small enough that a step of 32 completions takes a few seconds on a CPU core."""

PRETRAIN_DATA = DataConfig(seq_len=64, batch_size=16)
"""Corpus (shakespeare, stdlib fallback) and batch shape of the brief pretraining."""

_PRETRAIN_FORMAT = "hivenet-rl-pretrain-v2"  # v2: trained on one thread


def policy_cache_dir() -> Path:
    """Where pretrained policies are cached."""
    return Path(user_cache_dir("hivenet")) / "policies"


def pretrained_policy(
    model_config: ModelConfig = RL_MODEL_CONFIG,
    *,
    steps: int = 400,
    seed: int = 0,
    lr: float = 3e-3,
    data: DataConfig = PRETRAIN_DATA,
    cache_dir: Path | None = None,
) -> TinyGPT:
    """A `TinyGPT` trained for `steps` AdamW steps on `data`'s corpus, loaded from the cache if there.

    The cache key covers the model and data configs, steps, seed and learning rate. (The corpus
    name is part of the key too, so a stdlib fallback never poses as the shakespeare policy.)
    """
    corpus = load_corpus(data)
    key_text = "|".join(
        [
            _PRETRAIN_FORMAT,
            model_config.model_dump_json(),
            data.model_dump_json(),
            corpus.name,
            str(steps),
            str(seed),
            repr(lr),
        ]
    )
    key = hashlib.sha256(key_text.encode()).hexdigest()[:20]
    path = (cache_dir or policy_cache_dir()) / f"tinygpt-{key}.pt"
    model = TinyGPT(model_config)
    if path.exists():
        try:
            model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            return model
        except Exception as e:  # torch.load of a torn or foreign file raises many kinds: retrain over it
            logger.warning("ignoring unreadable cached policy %s (%s)", path, e)
    with one_torch_thread():  # the same weights whatever the caller's thread count
        model = _pretrain(model_config, corpus, steps=steps, seed=seed, lr=lr)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(model.state_dict(), tmp)
    tmp.replace(path)
    return model


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the block's torch ops on one thread: a multi-threaded reduction sums in another order,
    so a policy pretrained on N threads differs from one pretrained on 1, and the cache would
    hold whichever process came first."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _pretrain(model_config: ModelConfig, corpus: Corpus, *, steps: int, seed: int, lr: float) -> TinyGPT:
    torch.manual_seed(seed)
    model = TinyGPT(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / 20) * max(0.1, 1.0 - i / max(1, steps))
    )
    sampler = corpus.sampler(0, 1, seed_offset=seed)
    started = time.monotonic()
    model.train()
    for _ in range(steps):
        batch = sampler.next_batch()
        loss = model.loss(batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    logger.info(
        "pretrained the RL policy: %d steps in %.1f s, last loss %.3f",
        steps,
        time.monotonic() - started,
        float(loss.detach()),
    )
    return model


def rollout_seed(seed: int, step: int, group: int, index: int | None = None) -> int:
    """A 64-bit seed for the baseline's prompt (`index=None`) or completion `index` of `group` at `step`."""
    text = f"hivenet-sync-grpo|{seed}|{step}|{group}|{'prompt' if index is None else index}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def run_sync_grpo(
    task: Task,
    config: GRPOConfig,
    steps: int,
    seed: int,
    model: CausalLM,
    *,
    on_step: Callable[[int, GRPOStepReport], None] | None = None,
) -> list[float]:
    """Train `model` in place with `steps` synchronous GRPO steps; return the mean reward of each step.

    The mean reward of step i is over the completions sampled with the weights before update i.
    `on_step(step, report)` is called after every update.
    """
    learner = GRPOLearner(model, config)
    curve: list[float] = []
    for step in range(steps):
        groups: list[list[ScoredRollout]] = []
        for g in range(config.groups_per_step):
            prompt = task.prompt(rollout_seed(seed, step, g))
            group_id = rollout_seed(seed, step, g).to_bytes(8, "big")
            group = []
            for i in range(config.group_size):
                out = generate(
                    model,
                    prompt,
                    task.max_new_tokens,
                    config.sampling,
                    rollout_seed(seed, step, g, i),
                    stop_ids=task.stop_ids,
                    prove=False,
                )
                reward = task.reward(prompt, out.completion_ids)
                group.append(ScoredRollout(prompt, out.completion_ids, reward, learner.version, group_id))
            groups.append(group)
        report = learner.step(groups)
        curve.append(report.mean_reward)
        if on_step is not None:
            on_step(step, report)
    return curve
