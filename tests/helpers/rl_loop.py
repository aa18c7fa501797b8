"""Building blocks for tests of the RL loop: loopback nodes, honest groups, a scripted worker, a fake judge.

- `tiny_run` / `TINY`: a run small enough for a test (a 1-layer TinyGPT, groups of 4).
- `LoopbackNodes`: real `HivenetNode`s on 127.0.0.1 (a seed first), stopped in reverse order.
- `honest_group`: exactly what an honest `InferenceWorker` generates for a ticket; `policy_at`: the
  policy a trainer published as a version, to generate it with.
- `ScriptedWorker`: a node that asks for tickets and submits whatever a test hands it (honest,
  replayed, cut short) over the real protocols, so the test decides what crosses the network and when.
- `FakeJudge`: a `RolloutJudge` that accepts the groups a predicate picks and remembers what it
  accepted and rejected, to check the trainer learns from nothing else.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.p2p import P2P

from node.broadcast.dialing import HolderDialer
from node.broadcast.wire import encode_frame
from node.config import NodeConfig
from node.membership import LiveNode
from node.node import HivenetNode
from node.rollouts import (
    PROTO_SUBMIT,
    TicketsRefused,
    connect_member,
    replicate_p2p,
    request_tickets,
    submit_group,
)
from node.swarm import wait_until
from protocol.assignment import derive_assignment
from protocol.limits import TICKET_NONCE_BYTES
from protocol.node_record import Role
from protocol.peer_keys import peer_id_from_private_key
from protocol.rollout_messages import open_group, rollout_hash, seal_group, seal_verdict
from protocol.rollouts_pb2 import Rollout, RolloutGroup, RolloutVerdict, Ticket
from protocol.toploc import proof_length
from training.causal_lm import CausalLM
from training.generation import generate
from training.grpo import GRPOConfig, ScoredRollout
from training.model import ModelConfig
from training.rl_run import RLRunConfig, group_id, model_from_state, run_task
from training.rl_trainer import RLTrainer
from training.sampling import SamplingParams

if TYPE_CHECKING:
    from verification.tickets import Ticket as IssuedTicket

__all__ = [
    "TINY",
    "FakeJudge",
    "LoopbackNodes",
    "ScriptedWorker",
    "fake_group",
    "honest_group",
    "policy_at",
    "tiny_run",
]

AnyTicket = Union[Ticket, "IssuedTicket"]
"""A ticket as the wire carries it, or as a validator's book holds it (both name counter, version, nonce)."""

TINY = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=96)
SUBMIT_TIMEOUT_S = 60.0


def tiny_run(steps: int | None, **overrides: Any) -> RLRunConfig:
    """A run of the tiny model with groups of 4, one group per step, async level 1 (unless overridden)."""
    grpo: dict[str, Any] = {"group_size": 4, "groups_per_step": 1, "async_level": 1}
    grpo.update({k: v for k, v in overrides.items() if k in GRPOConfig.model_fields})
    run = {k: v for k, v in overrides.items() if k not in GRPOConfig.model_fields}
    return RLRunConfig(run_id="rl-test", model=TINY, grpo=GRPOConfig(**grpo), max_trainer_steps=steps, **run)


class LoopbackNodes:
    """Real nodes of one run on 127.0.0.1, each with its own DHT and p2pd; `close()` stops them all."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.root = root
        self.run_id = run_id
        self.nodes: list[HivenetNode] = []
        seed = self._start("seed", [Role.SEED], [], dht_only=True)
        self.peers = seed.multiaddrs()

    def _start(
        self, name: str, roles: list[Role], peers: list[str], *, dht_only: bool = False, ledger: bool = False
    ) -> HivenetNode:
        config = NodeConfig(
            identity_path=self.root / f"{name}.key",
            weights_dir=self.root / f"{name}-weights",
            initial_peers=peers,
            roles=roles,
            public_name=name,
            run_id=self.run_id,
            host="127.0.0.1",
            record_ttl_s=20.0,
            refresh_interval_s=4.0,
            ledger_path=self.root / f"{name}.ledger.db" if ledger else None,
        )
        node = HivenetNode(config, dht_only=dht_only)
        node.start()
        self.nodes.append(node)
        return node

    def add(self, name: str, roles: list[Role], *, ledger: bool = False) -> HivenetNode:
        """Start a node called `name` (its key and weights live under `root`, so a restart keeps both);
        `ledger`: it keeps a receipts ledger there too (`node.receipt_sink`), and serves it."""
        return self._start(name, roles, self.peers, ledger=ledger)

    def stop(self, node: HivenetNode) -> None:
        node.stop()
        self.nodes.remove(node)

    def close(self) -> None:
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.stop()
        self.nodes.clear()


@contextlib.contextmanager
def loopback_nodes(root: Path, run_id: str) -> Iterator[LoopbackNodes]:
    nodes = LoopbackNodes(root, run_id)
    try:
        yield nodes
    finally:
        nodes.close()


def honest_group(model: CausalLM, config: RLRunConfig, worker: bytes, ticket: AnyTicket) -> RolloutGroup:
    """The group an honest worker generates with `model` (the ticket's policy version) for `ticket`."""
    grpo = config.grpo
    task = run_task(config)
    version, counter = int(ticket.policy_version), int(ticket.counter)
    assignment = derive_assignment(
        config.run_id, version, worker, counter, grpo.group_size, nonce=ticket.nonce
    )
    prompt = task.prompt(assignment.prompt_seed)
    sampling = SamplingParams(temperature=grpo.temperature, top_p=grpo.top_p)
    rollouts = []
    for seed in assignment.sampling_seeds:
        out = generate(
            model,
            prompt,
            task.max_new_tokens,
            sampling,
            seed,
            stop_ids=task.stop_ids,
            background_proofs=False,
        )
        rollouts.append(
            Rollout(
                prompt_ids=prompt,
                completion_ids=out.completion_ids,
                dtype=config.worker_dtype,
                device="cpu",
                temperature=grpo.temperature,
                top_p=grpo.top_p,
                seed=seed,
                proofs=out.proofs,
            ).SerializeToString()
        )
    return RolloutGroup(policy_version=version, counter=counter, task=task.name, rollouts=rollouts)


def policy_at(trainer: RLTrainer, version: int) -> CausalLM:
    """The policy `trainer` published as `version`, read back from its weight store (what a worker loads)."""
    entry = trainer.broadcast.store.get(trainer.config.run_id, version)
    assert entry is not None and entry.complete, f"the trainer holds no complete version {version}"
    return model_from_state(trainer.config, entry.load_state_dict(), torch.float32)


def fake_group(counter: int, *, version: int = 0, size: int = 4) -> RolloutGroup:
    """A structurally valid group whose rollouts differ from every other counter's (dummy proofs: for fake judges)."""
    rollouts = [
        Rollout(
            prompt_ids=[72, 105, 33],
            completion_ids=[(counter * 31 + index * 7 + t) % 256 for t in range(12)],
            dtype="float32",
            device="cpu",
            temperature=1.0,
            top_p=1.0,
            seed=counter * 100 + index,
            proofs=[bytes(proof_length(32 * 64))],
        ).SerializeToString()
        for index in range(size)
    ]
    return RolloutGroup(policy_version=version, counter=counter, task="line-length", rollouts=rollouts)


def submit_to_intake(trainer: RLTrainer, group: RolloutGroup, worker_key: Ed25519PrivateKey) -> None:
    """Hand `group`, sealed by `worker_key`, to `trainer`'s intake handler as if it came over a stream."""
    sealed = seal_group(worker_key, run_id=trainer.config.run_id, group=group, seq=int(group.counter))
    envelope, opened = open_group(sealed, run_id=trainer.config.run_id)

    async def judged() -> list[bytes]:
        return await trainer.intake.handler(peer_id_from_private_key(worker_key), envelope, opened)

    trainer.node.call(judged(), timeout_s=30)


def assert_steps_settle_at(trainer: RLTrainer, steps: int, timeout_s: float = 60.0) -> None:
    """Wait until `trainer` has taken `steps` steps and acted on every group delivered to it, then
    check it took no more: once settled, it cannot step again until another group arrives."""
    assert wait_until(lambda: len(trainer.reports) >= steps, timeout_s), f"fewer than {steps} steps"
    assert wait_until(lambda: trainer.settled, timeout_s), "the trainer never acted on its groups"
    assert len(trainer.reports) == steps, "the trainer stepped on more than it was given"


class ScriptedWorker:
    """A node with role inference that submits exactly what a test gives it, over the submit protocol."""

    def __init__(self, node: HivenetNode, config: RLRunConfig) -> None:
        assert node.dht is not None
        self.node = node
        self.config = config
        self.peer = node.identity.peer_id_bytes
        self.p2p: P2P = node.call(replicate_p2p(node.dht))
        self.dialer = HolderDialer(self.p2p, node.identity.peer_id, self._own_addresses)

    async def _own_addresses(self) -> tuple[str, ...]:
        assert self.node.dht is not None
        return tuple(str(m) for m in self.node.dht.get_visible_maddrs())

    def tickets(self, validator: LiveNode, version: int, count: int = 1) -> list[Ticket]:
        """This worker's open tickets at `validator`, topped up to `count` with tickets of `version`, over
        the ticket protocol."""

        async def go() -> list[Ticket]:
            await connect_member(self.dialer, validator)
            return await request_tickets(
                self.p2p,
                validator.peer_id,
                run_id=self.config.run_id,
                count=count,
                policy_version=version,
                timeout_s=SUBMIT_TIMEOUT_S,
            )

        return self.node.call(go(), timeout_s=SUBMIT_TIMEOUT_S + 10)

    def seal(self, group: RolloutGroup) -> bytes:
        return seal_group(
            self.node.identity.private_key, run_id=self.config.run_id, group=group, seq=int(group.counter)
        )

    def validator(self, peer_id_bytes: bytes, timeout_s: float = 30.0) -> LiveNode:
        """The live validator with this PeerID, once membership lists it."""
        found: list[LiveNode] = []

        def listed() -> bool:
            found[:] = [
                v for v in self.node.discover(Role.VALIDATOR) if v.peer_id.to_bytes() == peer_id_bytes
            ]
            return bool(found)

        assert wait_until(listed, timeout_s, interval_s=0.5), "the validator never showed up in membership"
        return found[0]

    def submit(self, validator: LiveNode, sealed: bytes) -> list[RolloutVerdict]:
        async def go() -> list[RolloutVerdict]:
            await connect_member(self.dialer, validator)
            return await submit_group(
                self.p2p, validator.peer_id, sealed, run_id=self.config.run_id, timeout_s=SUBMIT_TIMEOUT_S
            )

        return self.node.call(go(), timeout_s=SUBMIT_TIMEOUT_S + 10)

    def submit_cut_short(self, validator: LiveNode, sealed: bytes) -> None:
        """Start submitting `sealed`, then die: the frame's header and half its bytes, and the stream closes."""

        async def go() -> None:
            await connect_member(self.dialer, validator)
            _, _, writer = await self.p2p.call_binary_stream_handler(validator.peer_id, PROTO_SUBMIT)
            frame = encode_frame(sealed)
            writer.write(frame[: len(frame) // 2])
            await writer.drain()
            writer.close()

        self.node.call(go(), timeout_s=30.0)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.node.call(self.p2p.shutdown(), timeout_s=10.0)


class FakeJudge:
    """A `RolloutJudge` that accepts the groups `accept(worker, group)` picks, sealing real verdicts with `key`."""

    def __init__(
        self, node: HivenetNode, run_id: str, accept: Callable[[bytes, RolloutGroup], bool | str]
    ) -> None:
        """`accept(worker, group)`: True accepts the group, False rejects it as `sampling`, a string
        rejects it with that reason."""
        self.node = node
        self.run_id = run_id
        self.accept = accept
        self.accepted_hashes: set[bytes] = set()
        self.rejected_hashes: set[bytes] = set()
        self.versions: list[int] = []
        self.steps: list[int] = []
        self._next_counter: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def judge_groups(
        self, submissions: list[tuple[bytes, RolloutGroup]]
    ) -> list[tuple[list[bytes], list[ScoredRollout]]]:
        return [self.judge_group(worker, group) for worker, group in submissions]

    def judge_group(self, worker: bytes, group: RolloutGroup) -> tuple[list[bytes], list[ScoredRollout]]:
        decision = self.accept(worker, group)
        accepted = decision is True
        reason = "" if accepted else decision if isinstance(decision, str) else "sampling"
        hashes = [rollout_hash(data) for data in group.rollouts]
        with self._lock:
            (self.accepted_hashes if accepted else self.rejected_hashes).update(hashes)
        verdicts = [
            seal_verdict(
                self.node.identity.private_key,
                run_id=self.run_id,
                verdict=RolloutVerdict(
                    worker=worker,
                    rollout_hash=h,
                    policy_version=group.policy_version,
                    counter=group.counter,
                    index=i,
                    accepted=accepted,
                    reason=reason,
                    reward=0.5 if accepted else 0.0,
                    issued_at=time.time(),
                ),
            )
            for i, h in enumerate(hashes)
        ]
        if not accepted:
            return verdicts, []
        rollouts = [Rollout.FromString(data) for data in group.rollouts]
        return verdicts, [
            ScoredRollout(
                prompt_ids=list(r.prompt_ids),
                completion_ids=list(r.completion_ids),
                reward=(i % 2) * 1.0,
                policy_version=group.policy_version,
                group_id=group_id(worker, group.counter, self.node.identity.peer_id_bytes),
                rollout_hash=h,
                worker=worker,
            )
            for i, (r, h) in enumerate(zip(rollouts, hashes, strict=True))
        ]

    def issue_tickets(self, worker: bytes, count: int, version: int) -> list[Ticket]:
        """Fresh tickets of `version` once added (a fake judge keeps no book: it judges anything)."""
        with self._lock:
            if version not in self.versions:
                raise TicketsRefused(f"policy version {version} is not held (holding {self.versions})")
            first = self._next_counter.get(worker, 0)
            self._next_counter[worker] = first + count
            return [
                Ticket(counter=first + i, policy_version=version, nonce=bytes(TICKET_NONCE_BYTES))
                for i in range(count)
            ]

    def add_version(self, version: int, model: CausalLM) -> None:
        self.versions.append(version)

    def set_trainer_step(self, step: int) -> None:
        self.steps.append(step)
