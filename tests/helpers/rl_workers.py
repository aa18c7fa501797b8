"""Inference workers of an RL run, honest or not, building `RolloutGroup`s for validator tests.

A worker derives its assignment from a ticket (by default one whose nonce is `ZERO_NONCE`, what
the validators of these tests issue), builds the prompt with the task, generates one completion
per assigned seed with `training.generation.generate` (stopping at the task's stop token) and
serializes each as a `Rollout`. The `tamper` hooks let a test change what a dishonest worker
generates or submits.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from protocol import rollouts_pb2
from protocol.assignment import derive_assignment
from protocol.limits import TICKET_NONCE_BYTES
from training.generation import generate
from training.model import TinyGPT
from training.sampling import SamplingParams

ZERO_NONCE = bytes(TICKET_NONCE_BYTES)
"""The nonce of every ticket the validators of these tests issue (`zero_nonces`)."""


def zero_nonces(size: int) -> bytes:
    """A ticket book's nonce source for tests: predictable, so groups can be built before tickets."""
    return bytes(size)


DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class FakeTask:
    """A tiny task: the prompt is the bytes of a short question, the reward the share of low bytes."""

    def __init__(
        self, name: str = "lowbytes", max_new_tokens: int = 40, stop_ids: frozenset[int] = frozenset()
    ) -> None:
        self.name = name
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_ids

    def prompt(self, prompt_seed: int) -> list[int]:
        return list(f"Q{prompt_seed % 997}: low bytes?".encode())

    def reward(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
        return sum(1 for t in completion_ids if t < 128) / len(completion_ids)


@dataclass
class Generated:
    """What a worker generated for one completion, before serializing it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    proofs: list[bytes]
    seed: int
    dtype: str
    sampling: SamplingParams

    def to_rollout(self) -> rollouts_pb2.Rollout:
        return rollouts_pb2.Rollout(
            prompt_ids=self.prompt_ids,
            completion_ids=self.completion_ids,
            dtype=self.dtype,
            device="cpu",
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            seed=self.seed,
            proofs=self.proofs,
        )


Tamper = Callable[[int, Generated], None]
"""Edits the `index`-th generated completion in place before it is serialized."""


class RLWorker:
    """Generates rollout groups for `worker` (PeerID bytes) with given policy weights per version."""

    def __init__(
        self,
        worker: bytes,
        *,
        run_id: str,
        task: FakeTask,
        group_size: int,
        sampling: SamplingParams | None = None,
    ) -> None:
        self.worker = worker
        self.run_id = run_id
        self.task = task
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self._models: dict[tuple[int, torch.dtype], tuple[TinyGPT, TinyGPT]] = {}

    def _model(self, model: TinyGPT, dtype: torch.dtype) -> TinyGPT:
        """`model` cast to `dtype`, cached (the source is kept in the entry so its id stays unique)."""
        key = (id(model), dtype)
        if key not in self._models:
            self._models[key] = (model, copy.deepcopy(model).to(dtype).eval())
        return self._models[key][1]

    def group(
        self,
        model: TinyGPT,
        version: int,
        counter: int,
        *,
        dtype: torch.dtype = torch.bfloat16,
        as_worker: bytes | None = None,
        sampling: SamplingParams | None = None,
        max_new_tokens: int | None = None,
        choose: Callable[[int, torch.Tensor, int], int] | None = None,
        tamper: Tamper | None = None,
        task_name: str | None = None,
        nonce: bytes = ZERO_NONCE,
    ) -> rollouts_pb2.RolloutGroup:
        """The group of ticket (`counter`, `version`, `nonce`) of `as_worker` (default: this worker)."""
        sampling = sampling or self.sampling
        assignment = derive_assignment(
            self.run_id, version, as_worker or self.worker, counter, self.group_size, nonce=nonce
        )
        prompt = self.task.prompt(assignment.prompt_seed)
        rollouts = []
        for i, seed in enumerate(assignment.sampling_seeds):
            out = generate(
                self._model(model, dtype),
                prompt,
                max_new_tokens or self.task.max_new_tokens,
                sampling,
                seed,
                stop_ids=self.task.stop_ids,
                choose=choose,
                background_proofs=False,
            )
            gen = Generated(prompt, out.completion_ids, list(out.proofs), seed, DTYPE_NAMES[dtype], sampling)
            if tamper is not None:
                tamper(i, gen)
            rollouts.append(gen.to_rollout().SerializeToString())
        return rollouts_pb2.RolloutGroup(
            policy_version=version, counter=counter, task=task_name or self.task.name, rollouts=rollouts
        )
