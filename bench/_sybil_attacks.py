"""Part 6 of `bench/robustness.py`: free identities against a trainer's state, and a peer's string against a worker.

* **Sybil-agreed state** (`sybil_state_accepted`, target 0): how many honest trainers take a poisoned
  state that several fresh identities agree on, over three scenarios. (1) Two trainers of a gather
  run that have averaged together; three identities declare outer step 50 and serve one consistent
  poisoned state: a trainer counts as taken if its next round does not average with its partner in
  sync, or if a resync download would hand it the state. (2) A DiLoCo trainer outvoted by its group
  resyncs, and the state on offer (as two agreeing sources would serve it) is large random weights:
  taken if the trainer adopts it. (3) The same for an RL trainer's DiLoCo resync.
* **A peer's string against a worker** (`worker_killed_by_string`, target 0): a validator signs
  verdicts whose reason and detail are hostile text (rich markup, ANSI and OSC escapes, control
  characters, line breaks, a huge string); each goes through the worker's own path, opened as the
  worker opens it and reported through the line printer `hivenet join` gives an inference worker,
  on a terminal console. Counted: strings that raised out of the worker's reporting path, or put an
  escape or bell character on the terminal.
* **Rogue validators** (`rogue_validator_groups_lost`, target 0): an RL run on 127.0.0.1 (a trainer
  with its validator, one inference worker) and two nodes that anyone could start, announcing the
  validator role; the worker sees both and generates 12 groups. Counted: groups the rogues got
  (judged, or reported to the worker as theirs), which the run would never train on.
* **Records that aim at third parties** (`third_party_dials`, target 0): a fake validator record
  lists 13 ports of another public host and 3 private addresses (16: the most a record holds); no seed the worker trusts
  attested any of them. The worker's dialler (`node.rollouts.peers.connect_member`, recording
  instead of dialling) connects five times, as a worker asking for tickets and submitting does.
  Counted: addresses dialled.
"""

from __future__ import annotations

import asyncio
import io
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import torch
from hivemind.p2p import PeerID
from rich.console import Console

from cli.output import plain_printer
from node.broadcast.dialing import HolderDialer
from node.collective.outer_state import OuterState
from node.identity import create_identity
from node.rollouts.peers import connect_member
from node.swarm import wait_until
from protocol import rollouts_pb2 as rpb
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.node_record import Role
from protocol.rollout_messages import DOMAIN_VERDICT, open_verdict
from tests.helpers.fuzzing import HOSTILE_TEXT_SAMPLES
from tests.helpers.members import live_member
from tests.helpers.poisoning import sybil_state_round
from tests.helpers.receipts import new_peer
from tests.helpers.recording_p2p import RecordingP2P
from tests.helpers.rl_diloco import FixedStateSource, OutvotedAverager, scored_groups
from tests.helpers.rl_loop import LoopbackNodes, tiny_run
from tests.helpers.rollouts import RUN, key, peer_bytes
from training.diloco import DiLoCoConfig, DiLoCoTrainer
from training.grpo import GRPOConfig
from training.model import ModelConfig, TinyGPT
from training.rl_diloco import DiLoCoUpdates, OuterVersionLearner
from training.rl_run import RLDiLoCoConfig
from training.rl_worker import GroupReport, InferenceWorker
from verification.rl_roles import StandaloneValidator, start_rl_trainer

HONEST_HASH = "00" * 8
TINY = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=96)
HOSTILE_TEXT = [*HOSTILE_TEXT_SAMPLES, "[" * 100_000, "[/]" * 1000]
NOW = 1_800_000_000.0


def _gather_trainers_taken() -> int:
    """Scenario (1): how many of the two running trainers gave up their state for the sybils'."""
    result = sybil_state_round()
    taken = 0
    for outcome, offered in zip(result.outcomes, result.offered, strict=True):
        moved = offered is not None and offered.hash() == result.poisoned.hash()
        taken += int(moved or not (outcome.in_sync and outcome.num_peers == 2))
    return taken


def _poisoned_like(model: torch.nn.Module, step: int) -> OuterState:
    gen = torch.Generator().manual_seed(7)
    params = [torch.randn(p.shape, generator=gen) * 50.0 for p in model.parameters()]
    return OuterState(params, [torch.zeros_like(p) for p in params], step)


def _diloco_resync_taken() -> int:
    """Scenario (2): whether an outvoted DiLoCo trainer adopts the poisoned state on offer."""
    torch.manual_seed(0)
    model = TinyGPT(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=32))
    text = torch.tensor(list(b"abcabcabd" * 40), dtype=torch.long)
    gen = torch.Generator().manual_seed(1)

    def batch() -> torch.Tensor:
        starts = torch.randint(0, len(text) - 17, (4,), generator=gen).tolist()
        return torch.stack([text[s : s + 17] for s in starts])

    poisoned = _poisoned_like(model, 50)
    trainer = DiLoCoTrainer(
        model,
        DiLoCoConfig(inner_steps=3, max_outer_steps=1, inner_warmup_steps=0),
        next_batch=batch,
        averager=OutvotedAverager(),
        state_source=FixedStateSource(poisoned),
        eval_batches=[batch(), batch()],
    )
    reports = trainer.run(threading.Event())
    return int(any(r.resynced for r in reports) or trainer.state.hash() == poisoned.hash())


def _rl_resync_taken() -> int:
    """Scenario (3): whether an outvoted RL DiLoCo trainer adopts the poisoned state on offer."""
    torch.manual_seed(4)
    policy = TinyGPT(TINY)
    poisoned = _poisoned_like(policy, 1)
    grpo = GRPOConfig(group_size=4, groups_per_step=1, async_level=1, lr=1e-2)
    learner = OuterVersionLearner(policy, grpo, inner_steps=1, outer_version=0)
    updates = DiLoCoUpdates(
        learner, RLDiLoCoConfig(inner_steps=1), OutvotedAverager(), state_source=FixedStateSource(poisoned)
    )
    updates.step(scored_groups(8, 0))
    return int(updates.records[-1].resynced or updates.state.hash() == poisoned.hash())


def sybil_state() -> dict[str, str]:
    scenarios = {
        "running gather trainers (of 2)": _gather_trainers_taken(),
        "DiLoCo resync (of 1)": _diloco_resync_taken(),
        "RL DiLoCo resync (of 1)": _rl_resync_taken(),
    }
    for name, taken in scenarios.items():
        print(f"sybil-agreed state: {name}: {taken} took it")
    return {"sybil_state_accepted": str(sum(scenarios.values()))}


def _killed_by(text: str, validator: object) -> bool:
    """Whether `text` as a verdict's reason and as its detail broke the worker's reporting path."""
    killed = False
    for reason, detail in ((text, "detail"), ("reward_error", text)):
        verdict = rpb.RolloutVerdict(
            worker=peer_bytes(key("bench worker")), rollout_hash=b"\x01" * 32, accepted=False,
            reason=reason, detail=detail, issued_at=NOW,
        )  # fmt: skip
        try:  # a hostile validator signs whatever it likes
            sealed = seal(
                validator,  # type: ignore[arg-type]
                domain=DOMAIN_VERDICT,
                run_id=RUN,
                payload=verdict.SerializeToString(),
                expires_at=NOW + 60,
                seq=0,
            )
            _, opened = open_verdict(sealed, run_id=RUN, validator=peer_bytes(validator), now=NOW)  # type: ignore[arg-type]
        except InvalidMessage:  # refused where it is parsed: nothing reaches the worker
            continue
        report = GroupReport(1, 0, "validatr", 10, 0.5)
        report.rejected[opened.reason] += 1
        out = io.StringIO()
        printer = plain_printer(Console(file=out, force_terminal=True, width=100))
        worker = SimpleNamespace(
            node=SimpleNamespace(short_id="w0"),
            reports=[],
            on_group=lambda r, p=printer, d=opened.detail: p(f"{r.describe()} {d}"),  # type: ignore[misc]
        )
        try:
            InferenceWorker._report(worker, report)  # type: ignore[arg-type]
        except Exception:
            killed = True
        printed = out.getvalue()
        if "\x1b" in printed or "\x07" in printed:  # an unstyled line has no escape of its own
            killed = True
    return killed


def worker_strings() -> dict[str, str]:
    validator = key("bench hostile validator")
    killed = [text[:20] for text in HOSTILE_TEXT if _killed_by(text, validator)]
    print(
        f"hostile verdict strings: {len(HOSTILE_TEXT)} tried, {len(killed)} broke the worker's reporting {killed}"
    )
    return {"worker_killed_by_string": str(len(killed))}


def rogue_validators(groups: int = 12) -> dict[str, str]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trainer_id = create_identity(root / "trainer.key").peer_id.to_base58()
        config = tiny_run(None, async_level=4, authorized_publishers=[trainer_id])
        nodes = LoopbackNodes(root, config.run_id)
        trainer = worker = None
        try:
            trainer, _ = start_rl_trainer(
                nodes.add("trainer", [Role.TRAINER, Role.VALIDATOR]), config, TinyGPT(TINY)
            )
            rogues = [
                StandaloneValidator(nodes.add(f"rogue{i}", [Role.VALIDATOR]), config).start()
                for i in range(2)
            ]
            worker = InferenceWorker(nodes.add("worker", [Role.INFERENCE]), config).start()
            rogue_ids = {r.node.identity.peer_id for r in rogues}
            assert wait_until(
                lambda: rogue_ids <= {v.peer_id for v in worker.node.discover(Role.VALIDATOR)}, 60.0
            ), "the worker never saw the rogue validators: the attack would prove nothing"
            seen = len(worker.reports)
            assert wait_until(lambda: len(worker.reports) >= seen + groups, 300.0)
            rogue_names = {r.node.short_id for r in rogues}
            reported = sum(r.validator in rogue_names for r in worker.reports)
            judged = sum(r.validator.stats().groups for r in rogues)
        finally:
            if worker is not None:
                worker.stop()
            if trainer is not None:
                trainer.stop()
            nodes.close()
    print(f"rogue validators: the worker generated {len(worker.reports)} groups; the two rogues judged "
          f"{judged}, and {reported} were reported as theirs")  # fmt: skip
    return {"rogue_validator_groups_lost": str(max(judged, reported))}


def third_party_dials(attempts: int = 5) -> dict[str, str]:
    victim = tuple(f"/ip4/93.184.216.34/tcp/{port}" for port in range(9000, 9013))
    private = ("/ip4/10.0.0.5/tcp/22", "/ip4/127.0.0.1/tcp/6379", "/ip4/169.254.169.254/tcp/80")
    p2p = RecordingP2P(reachable=False)

    async def public_node() -> tuple[str, ...]:
        return ("/ip4/198.51.100.7/tcp/31337",)

    _, seed = new_peer()
    dialer = HolderDialer(p2p, PeerID(new_peer()[1]), public_node, {seed})  # type: ignore[arg-type]
    member = live_member(new_peer()[1], private + victim, name="fake validator")
    for _ in range(attempts):
        asyncio.run(connect_member(dialer, member))
    print(f"third-party addresses: a fake validator record of {len(victim) + len(private)} addresses, "
          f"{attempts} connection attempts: {len(p2p.dialled)} dials")  # fmt: skip
    return {"third_party_dials": str(len(p2p.dialled))}


def run_sybil_attacks() -> dict[str, str]:
    """Part 6's figures (see the module docstring)."""
    return {**sybil_state(), **worker_strings(), **rogue_validators(), **third_party_dials()}
