"""The inference worker role: follow the run's policy, generate assigned rollouts with proofs, submit them.

`InferenceWorker(node, config)` hosts a `WeightBroadcast` on the node and follows the run's
versions, keeping the newest `async_level + 1` as models. Its loop takes assignment after
assignment (`protocol.assignment`: the prompt and the sampling seeds are derived from the run,
the version, this node's PeerID and a counter, never chosen), generates the group's completions
with seeded sampling and TOPLOC proofs and seals the group with the node's key. Once it holds
`groups_per_submission` groups, or sooner when a newer version arrives, it submits them all at
once (a stream each, so a validator judges them in one batch) to a validator found through
membership, failing over to the next validator when one does not answer, and submitting again a
group a validator could not judge yet because it does not hold its version. Every group ends in
a `GroupReport` (version, accepted/rejected by reason, tokens/s).

The next assignment counter is kept next to the weights store, and the versions the store
already holds are loaded at start: a restarted worker goes on where it stopped. The validators'
signed verdicts (the worker's receipts) go into the node's ledger when it keeps one.

`cheat` makes a dishonest worker for demos, tests and benchmarks: it generates in another
precision than it claims, or with other weights than the version it names.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from node.broadcast.store import VersionEntry
from node.membership import LiveNode
from node.node import HivenetNode
from node.rollouts.client import Receipt, submit_group_receipts
from node.rollouts.peers import connect_member
from node.runtime import offload
from protocol.assignment import derive_assignment
from protocol.node_record import Role
from protocol.rollout_messages import BANNED, GROUP_SIZE, STALE, UNKNOWN_VERSION, seal_group
from protocol.rollouts_pb2 import Rollout, RolloutGroup
from training.causal_lm import CausalLM
from training.devices import resolve_device
from training.generation import generate_group
from training.rl_run import (
    DTYPES,
    ModelWindow,
    RLRunConfig,
    RoleThread,
    add_policy_follower,
    held_versions,
    model_from_state,
    run_task,
)
from training.sampling import SamplingParams
from training.tasks import Task

__all__ = ["CheatMode", "GroupReport", "InferenceWorker"]

logger = logging.getLogger(__name__)

_NO_VALIDATOR_WAIT_S = 1.0
_NO_VERSION_WAIT_S = 1.0


class CheatMode(enum.StrEnum):
    """Ways a dishonest worker can cut corners (only for demos, tests and benchmarks)."""

    PRECISION = "precision"
    """Generates in bfloat16 but claims the run's precision."""
    WEIGHTS = "weights"
    """Generates with perturbed weights but names the real version."""


@dataclass(frozen=True)
class _Generated:
    """A generated group, sealed and waiting to be submitted."""

    counter: int
    version: int
    tokens: int
    seconds: float
    sealed: bytes


@dataclass
class GroupReport:
    """What happened to one submitted group."""

    counter: int
    version: int
    validator: str
    tokens: int
    seconds: float
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    error: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        if self.error:
            return f"group {self.counter:>4} | v{self.version} | not judged: {self.error}"
        rejected = ", ".join(f"{reason} {n}" for reason, n in sorted(self.rejected.items())) or "0"
        return (
            f"group {self.counter:>4} | v{self.version} | accepted {self.accepted} | rejected {rejected} | "
            f"{self.tokens_per_s:,.0f} tokens/s | validator {self.validator}"
        )


def _refusal(outcomes: list[tuple[str, list[Receipt], str]]) -> str | None:
    """What stands in the worker's way after a submission: every validator that judged it banned it, or
    found its version stale (None when anything was judged on its merits)."""
    reasons = {
        (validator, receipt.verdict.reason) for validator, receipts, _ in outcomes for receipt in receipts
    }
    if reasons and all(reason == GROUP_SIZE for _, reason in reasons):
        details = {receipt.verdict.detail for _, receipts, _ in outcomes for receipt in receipts}
        return (
            f"validators refuse its groups: {'; '.join(sorted(details))}. Start this worker with the run's "
            "--group-size (every node of an RL run needs the same RL options)"
        )
    if not reasons or any(reason not in (BANNED, STALE) for _, reason in reasons):
        return None
    banned_by = sorted(validator for validator, reason in reasons if reason == BANNED)
    if banned_by:
        return f"banned by validator(s) {', '.join(banned_by)}; their bans expire, then it submits again"
    return (
        "its groups arrive stale (the trainer moved past their policy version); it follows the newest version"
    )


class InferenceWorker(RoleThread):
    """Generates and submits rollout groups for one RL run on a started node, in a thread of its own."""

    def __init__(
        self,
        node: HivenetNode,
        config: RLRunConfig,
        *,
        cheat: CheatMode | None = None,
        on_group: Callable[[GroupReport], None] | None = None,
        max_groups: int | None = None,
    ) -> None:
        assert node.dht is not None, "start the node first"
        self.node = node
        self.config = config
        self.task: Task = run_task(config)
        self.device = resolve_device(node.config.device)
        config.check_worker_device(self.device.type)
        self.cheat = cheat
        self.on_group = on_group
        self.max_groups = max_groups
        self.window = ModelWindow(config.grpo.async_level + 1)
        self.reports: list[GroupReport] = []
        self.received_at: dict[int, float] = {}
        """When each policy version became usable here (for the weight pick-up latency)."""
        self.first_rollout_at: dict[int, float] = {}
        self.receipts: list[Receipt] = []
        """Every verdict received, as sealed by its validator: this worker's proof of its contribution."""
        self.cpu_seconds = 0.0
        """CPU time the loop thread spent generating, proving and sealing (submission waits excluded)."""
        self.decode_cpu_seconds = 0.0
        """The part of `cpu_seconds` spent decoding alone (proofs, serialisation and sealing excluded):
        what a plain generation loop would have spent on the same rollouts."""
        super().__init__()
        self._validator_turn = 0
        self.counter_path = node.config.weights_dir / f"{config.run_id}.next-counter"
        """The next assignment counter, kept so that a restarted worker does not redo used ones (replays)."""
        self.broadcast = add_policy_follower(node, config)
        self.trusted = frozenset([*config.authorized_publishers, *config.trusted_validators])
        """The validators this worker submits to: the run's trainers (each runs one) and its trusted
        standalone validators. Any node may claim the validator role; a rogue one would answer
        "accepted", forward nothing and so swallow the work."""
        self.waiting_for: str | None = None
        self._no_version = (
            f"no policy version of run {config.run_id!r} yet, from its publishers "
            f"{', '.join(p[-8:] for p in config.authorized_publishers) or '(none named)'}"
        )
        """Why the worker is not generating or submitting right now (None while it is), as last logged."""

    def _waiting(self, reason: str | None, *, level: int = logging.INFO) -> None:
        """Say what the worker waits for, once each time that changes (and when it stops waiting); a
        refusal (a ban, a wrong group size) is a warning, waiting for the run to start is not."""
        if reason == self.waiting_for:
            return
        if reason is not None:
            logger.log(level, "[%s] waiting: %s", self.node.short_id, reason)
        elif self.waiting_for is not None:
            logger.info("[%s] no longer waiting (%s)", self.node.short_id, self.waiting_for)
        self.waiting_for = reason

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> InferenceWorker:
        self.node.call(self._follow())
        self._start_thread(f"worker-{self.node.short_id}")
        return self

    async def _follow(self) -> None:
        # a restarted worker's store may hold the newest versions already: following fetches only newer ones
        for entry in held_versions(self.broadcast, self.config.run_id, self.window.size):
            await self._on_version(entry)
        self.broadcast.follow(self.config.run_id, on_version=self._on_version)

    # ---- policy versions -----------------------------------------------------------------

    async def _on_version(self, entry: VersionEntry) -> None:
        state = await offload(entry.load_state_dict)
        model = await offload(
            model_from_state, self.config, state, DTYPES[self.config.worker_dtype], self.device
        )
        self.window.add(entry.version, model)
        self.received_at.setdefault(entry.version, time.time())
        logger.info("[%s] policy version %d ready", self.node.short_id, entry.version)

    def _generating_model(self, model: CausalLM) -> CausalLM:
        if self.cheat is CheatMode.PRECISION:
            other = torch.bfloat16 if model.dtype != torch.bfloat16 else torch.float32
            return copy.deepcopy(model).to(other).eval()
        if self.cheat is CheatMode.WEIGHTS:
            tampered = copy.deepcopy(model)
            with torch.no_grad():
                for p in tampered.parameters():
                    p.mul_(1.0 + 0.01 * torch.randn_like(p))
            return tampered.eval()
        return model

    # ---- the loop ------------------------------------------------------------------------

    def _saved_counter(self) -> int:
        try:
            return max(0, int(self.counter_path.read_text()))
        except (OSError, ValueError):
            return 0

    def _save_counter(self, next_counter: int) -> None:
        self.counter_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.counter_path.with_name(self.counter_path.name + ".tmp")
        tmp.write_text(str(next_counter))
        tmp.replace(self.counter_path)

    def _run(self) -> None:
        counter = self._saved_counter()
        first = counter
        while not self._stop.is_set() and (self.max_groups is None or counter - first < self.max_groups):
            wanted = self.config.groups_per_submission
            if self.max_groups is not None:
                wanted = min(wanted, first + self.max_groups - counter)
            generated: list[_Generated] = []
            while len(generated) < wanted and not self._stop.is_set():
                newest = self.window.newest()
                if newest is None:
                    if generated:
                        break  # submit what is ready rather than sit on it
                    self._waiting(self._no_version)
                    self._stop.wait(_NO_VERSION_WAIT_S)
                    continue
                if self.waiting_for == self._no_version:
                    self._waiting(None)  # other obstacles (a ban) last until a submission shows them gone
                version, model = newest
                if generated and version != generated[-1].version:
                    break  # the policy moved on: what is ready goes now, before it grows staler
                try:
                    generated.append(self._generate(counter, version, model))
                except Exception as exc:  # a bug must not kill the worker silently
                    logger.exception("[%s] group %d failed", self.node.short_id, counter)
                    self._report(GroupReport(counter, version, "-", 0, 0.0, error=repr(exc)))
                counter += 1
            if not generated:
                continue
            outcomes = self._submit(generated)
            if outcomes is None:
                return  # stopped while looking for a validator
            for g, (validator, receipts, error) in zip(generated, outcomes, strict=True):
                self._report(self._judged(g, validator, receipts, error))

    def _report(self, report: GroupReport) -> None:
        self.reports.append(report)
        if self.on_group is not None:
            try:
                self.on_group(report)
            except Exception:  # printing what a validator said must never stop the worker
                logger.exception(
                    "[%s] reporting group %d failed; the worker goes on", self.node.short_id, report.counter
                )

    def _generate(self, counter: int, version: int, model: CausalLM) -> _Generated:
        """Generate, prove and seal the group of assignment `counter` with policy `version`."""
        grpo = self.config.grpo
        me = self.node.identity.peer_id_bytes
        assignment = derive_assignment(self.config.run_id, version, me, counter, grpo.group_size)
        prompt = self.task.prompt(assignment.prompt_seed)
        sampling = SamplingParams(temperature=grpo.temperature, top_p=grpo.top_p)
        generator = self._generating_model(model)
        started = time.perf_counter()
        cpu_started = time.thread_time()
        self.first_rollout_at.setdefault(version, time.time())
        # the group's seeds decoded as one batch; proofs inline: the whole cost stays on this thread's CPU clock
        decode_started = time.thread_time()
        outs = generate_group(
            generator,
            prompt,
            self.task.max_new_tokens,
            sampling,
            assignment.sampling_seeds,
            stop_ids=self.task.stop_ids,
        )
        self.decode_cpu_seconds += (
            time.thread_time() - decode_started - sum(o.proof_cpu_seconds for o in outs)
        )
        tokens = sum(len(out.completion_ids) for out in outs)
        rollouts = [
            Rollout(
                prompt_ids=prompt,
                completion_ids=out.completion_ids,
                dtype=self.config.worker_dtype,
                device=self.device.type,
                temperature=grpo.temperature,
                top_p=grpo.top_p,
                seed=seed,
                proofs=out.proofs,
            ).SerializeToString()
            for seed, out in zip(assignment.sampling_seeds, outs, strict=True)
        ]
        seconds = time.perf_counter() - started
        group = RolloutGroup(policy_version=version, counter=counter, task=self.task.name, rollouts=rollouts)
        sealed = seal_group(
            self.node.identity.private_key, run_id=self.config.run_id, group=group, seq=counter
        )
        self.cpu_seconds += time.thread_time() - cpu_started
        self.node.metrics.rollouts_generated(len(rollouts), tokens=tokens)
        self._save_counter(counter + 1)  # generated, the counter is used: a restart goes on after it
        return _Generated(counter, version, tokens, seconds, sealed)

    def _judged(self, g: _Generated, validator: str, receipts: list[Receipt], error: str) -> GroupReport:
        """Keep the receipts of a submitted group and report its verdicts."""
        report = GroupReport(g.counter, g.version, validator, g.tokens, g.seconds, error=error)
        self.receipts.extend(receipts)
        sink = self.node.receipt_sink
        if sink is not None and receipts:  # its own proof of what it gave, kept and served by its node
            sink([receipt.envelope for receipt in receipts])
        for receipt in receipts:
            if receipt.verdict.accepted:
                report.accepted += 1
            else:
                report.rejected[receipt.verdict.reason] += 1
        return report

    def _submit(self, generated: list[_Generated]) -> list[tuple[str, list[Receipt], str]] | None:
        """Submit the groups, all at once, to one validator after another until each is judged; None if
        stopped first.

        A validator that does not hold a group's version yet refuses it as `unknown_version` without
        judging it: the group goes to the next validator, and again to all of them while its version
        is still one this worker generates with, for up to `submit_timeout_s`.
        """
        outcomes: list[tuple[str, list[Receipt], str] | None] = [None] * len(generated)
        unjudged: dict[int, tuple[str, list[Receipt], str]] = {}
        deadline = time.monotonic() + self.config.submit_timeout_s
        while not self._stop.is_set():
            validators = [
                v for v in self.node.discover(Role.VALIDATOR) if v.peer_id.to_base58() in self.trusted
            ]
            if not validators:
                self._waiting(
                    f"none of the validators run {self.config.run_id!r} trusts is live yet (its trainers, "
                    "and those named with --trusted-validator); any other node claiming the role is ignored"
                )
                self._stop.wait(_NO_VALIDATOR_WAIT_S)
                continue
            self._validator_turn += 1
            ordered = (
                validators[self._validator_turn % len(validators) :]
                + validators[: self._validator_turn % len(validators)]
            )
            errors = []
            for live in ordered:
                todo = [i for i, outcome in enumerate(outcomes) if outcome is None]
                if not todo:
                    break
                try:
                    answers = self.node.call(
                        self._submit_to(live, [generated[i].sealed for i in todo]),
                        timeout_s=self.config.submit_timeout_s + 15.0,
                    )
                except Exception as exc:
                    answers = [exc] * len(todo)
                for i, answer in zip(todo, answers, strict=True):
                    if isinstance(answer, BaseException):
                        errors.append(f"{live.short_id}: {answer}")
                        logger.warning(
                            "[%s] validator %s: %s; trying another", self.node.short_id, live.short_id, answer
                        )
                    elif answer and all(r.verdict.reason == UNKNOWN_VERSION for r in answer):
                        unjudged[i] = (live.short_id, answer, "")
                    else:
                        outcomes[i] = (live.short_id, answer, "")
            for i, outcome in unjudged.items():
                version_gone = generated[i].version not in self.window.versions()
                if outcomes[i] is None and (version_gone or time.monotonic() > deadline):
                    outcomes[i] = outcome
            done = [outcome for outcome in outcomes if outcome is not None]
            if len(done) == len(generated):
                self._waiting(_refusal(done), level=logging.WARNING)
                return done
            if unjudged:
                self._waiting(
                    f"validators do not hold policy v{max(generated[i].version for i in unjudged)} yet "
                    "(they answer unknown_version); resubmitting"
                )
            if errors:
                logger.warning(
                    "[%s] no validator judged the group: %s", self.node.short_id, "; ".join(errors)
                )
            self._stop.wait(_NO_VALIDATOR_WAIT_S)
        return None

    async def _submit_to(
        self, validator: LiveNode, sealed: list[bytes]
    ) -> list[list[Receipt] | BaseException]:
        """Dial `validator` at the addresses of its own signed record, then submit every group at once
        (a stream each): the receipts of each, or why it failed."""
        await connect_member(self.broadcast.p2p, validator)
        return await asyncio.gather(
            *(
                submit_group_receipts(
                    self.broadcast.p2p,
                    validator.peer_id,
                    group,
                    run_id=self.config.run_id,
                    timeout_s=self.config.submit_timeout_s,
                )
                for group in sealed
            ),
            return_exceptions=True,
        )
