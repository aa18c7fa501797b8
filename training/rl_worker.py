"""The inference worker role: follow the run's policy, generate assigned rollouts with proofs, submit them.

`InferenceWorker(node, config)` hosts a `WeightBroadcast` on the node and follows the run's
versions, keeping the newest `async_level + 1` as models. Its loop takes the run's trusted
validators in turn (found through membership): it asks the next one for `groups_per_submission`
tickets (`protocol.assignment`: each fixes a counter, the policy version and a random nonce, from
which the prompt and the sampling seeds derive; none is chosen by the worker), generates each
ticket's group with that version (it asks for tickets of the newest version it holds that the
validator holds too), with seeded sampling and TOPLOC proofs, seals the groups with the node's key and submits them all at once (a
stream each, so the validator judges them in one batch) to that validator, the only one that can
judge them. An unanswered submission, or a group the validator cannot judge yet because it does
not hold its version again after a restart, is submitted there again until `submit_timeout_s`.
Every group ends in a `GroupReport` (version, accepted/rejected by reason, tokens/s).

The versions the store already holds are loaded at start, and a validator answers a worker's
ticket request with the tickets it still holds open there: a restarted worker regenerates those
and goes on. The validators' signed verdicts (the worker's receipts) go into the node's ledger
when it keeps one.

`cheat` makes a dishonest worker for demos, tests and benchmarks: it generates in another
precision than it claims, or with other weights than the version it names.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable

import torch

from node.broadcast.store import VersionEntry
from node.log_limit import LogOncePer
from node.membership import LiveNode
from node.node import HivenetNode
from node.rollouts.client import Receipt, submit_group_receipts
from node.rollouts.errors import TicketsRefused
from node.rollouts.peers import connect_member
from node.rollouts.tickets import request_tickets
from node.runtime import offload
from protocol.assignment import derive_assignment
from protocol.node_record import Role
from protocol.rollout_messages import UNKNOWN_VERSION, seal_group
from protocol.rollouts_pb2 import Rollout, RolloutGroup, Ticket
from training.causal_lm import CausalLM
from training.devices import resolve_device
from training.generation import generate_group
from training.rl_grinder import Grinder
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
from training.worker_groups import CheatMode, GeneratedGroup, GroupReport, refusal_summary

__all__ = ["CheatMode", "GroupReport", "InferenceWorker"]

logger = logging.getLogger(__name__)

_NO_VALIDATOR_WAIT_S = 1.0
_NO_VERSION_WAIT_S = 1.0
_SUBMIT_ATTEMPTS = 3
_FAILED_VALIDATOR_PAUSE_S = 60.0


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
        self.grinder = Grinder(self) if cheat is CheatMode.GRINDER else None
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
        self._failed_until: dict[str, float] = {}
        self._lapse_logged = LogOncePer(60.0)
        """Validators that did not answer lately, and until when they are passed over."""
        self.broadcast = add_policy_follower(node, config)
        self.trusted = frozenset([*config.authorized_publishers, *config.trusted_validators])
        """The validators this worker submits to: the run's trainers (each runs one) and its trusted
        standalone validators. Any node may claim the validator role; a rogue one would answer
        "accepted", forward nothing and so swallow the work."""
        self._no_version = (
            f"no policy version of run {config.run_id!r} yet, from its publishers "
            f"{', '.join(p[-8:] for p in config.authorized_publishers) or '(none named)'}"
        )
        """Why the worker is not generating or submitting right now (None while it is), as last logged."""

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

    def _run(self) -> None:
        produced = 0
        while not self._stop.is_set() and (self.max_groups is None or produced < self.max_groups):
            validator = self._next_validator()
            if validator is None:
                return  # stopped while looking for a validator
            wanted = self.config.groups_per_submission
            if self.max_groups is not None:
                wanted = min(wanted, self.max_groups - produced)
            tickets = self._tickets(validator, wanted)
            generated: list[GeneratedGroup] = []
            for ticket, model in tickets[:wanted]:
                if self._stop.is_set():
                    break
                if model is None:
                    continue
                try:
                    group = self.generate(ticket, model)
                    chosen = group if self.grinder is None else self.grinder.choose(ticket, group)
                    if chosen is not None:
                        generated.append(chosen)
                except Exception as exc:  # a bug must not kill the worker silently
                    logger.exception("[%s] group %d failed", self.node.short_id, ticket.counter)
                    self._report(
                        GroupReport(ticket.counter, ticket.policy_version, "-", 0, 0.0, error=repr(exc))
                    )
            if not generated:
                continue
            produced += len(generated)
            outcomes = self._submit(validator, generated)
            if outcomes is None:
                return  # stopped while submitting
            for g, (receipts, error) in zip(generated, outcomes, strict=True):
                self._report(self._judged(g, validator.short_id, receipts, error))
            done = [(validator.short_id, receipts, error) for receipts, error in outcomes]
            self._waiting(refusal_summary(done), level=logging.WARNING)

    def _trusted_validators(self) -> list[LiveNode]:
        return [v for v in self.node.discover(Role.VALIDATOR) if v.peer_id.to_base58() in self.trusted]

    def _next_validator(self) -> LiveNode | None:
        """The next of the run's trusted validators in turn, once one is live (one that failed lately
        only when no other is live); None if stopped first."""
        while not self._stop.is_set():
            validators = self._trusted_validators()
            now = time.monotonic()
            answering = [v for v in validators if self._failed_until.get(v.peer_id.to_base58(), 0.0) <= now]
            validators = answering or validators
            if validators:
                self._validator_turn += 1
                return validators[self._validator_turn % len(validators)]
            self._waiting(
                f"none of the validators run {self.config.run_id!r} trusts is live yet (its trainers, "
                "and those named with --trusted-validator); any other node claiming the role is ignored"
            )
            self._stop.wait(_NO_VALIDATOR_WAIT_S)
        return None

    def _tickets(self, validator: LiveNode, count: int) -> list[tuple[Ticket, CausalLM | None]]:
        """This worker's open tickets at `validator`, topped up to `count` with tickets of the newest
        version both hold (the worker asks for its own versions, newest first), each with the model
        of its version; none, after a pause, when the validator issues none or does not answer.

        The models are taken from the window when the worker asks, so a version the window drops
        while the request or the generation runs (a run that publishes faster than a group is made)
        is still the one its tickets are generated with; an open ticket of a version dropped before
        it asked has none (`_model_for`)."""
        held = {version: self.window.get(version) for version in self.window.versions()}
        if not held:
            self._waiting(self._no_version)
            self.window.wait_for_any(_NO_VERSION_WAIT_S)
            return []
        reason = ""
        for version in sorted(held, reverse=True):
            try:
                tickets = self.node.call(
                    self._request_tickets(validator, count, version),
                    timeout_s=self.config.submit_timeout_s + 15.0,
                )
                return [(t, self._model_for(t, held)) for t in tickets]
            except TicketsRefused as exc:
                reason = str(exc)  # maybe it does not hold this version yet: an older one, then
            except Exception as exc:
                reason = f"validator {validator.short_id}: {exc}"
                self._failed(validator)
                break
        self._waiting(f"no tickets: {reason}", level=logging.WARNING)
        self._stop.wait(_NO_VALIDATOR_WAIT_S)
        return []

    async def _request_tickets(self, validator: LiveNode, count: int, version: int) -> list[Ticket]:
        await connect_member(self.broadcast.dialer, validator)
        return await request_tickets(
            self.broadcast.p2p,
            validator.peer_id,
            run_id=self.config.run_id,
            count=count,
            policy_version=version,
            timeout_s=self.config.submit_timeout_s,
        )

    def _failed(self, validator: LiveNode) -> None:
        """Pass over `validator` for a while: it did not answer (its tickets would be lost again)."""
        self._failed_until[validator.peer_id.to_base58()] = time.monotonic() + _FAILED_VALIDATOR_PAUSE_S

    def _model_for(self, ticket: Ticket, held: dict[int, CausalLM | None]) -> CausalLM | None:
        """The model of the ticket's version among those `held` when the worker asked for it; None if
        it held none (then the ticket lapses). It asks for tickets of versions it holds, so only a
        ticket left open from before a restart, or from a request whose answer came too late, can
        name one it no longer has."""
        version = int(ticket.policy_version)
        model = held.get(version)
        if model is None:
            model = self.window.get(version)
        if model is None and self._lapse_logged((ticket.counter, version)):  # asked again, it comes back
            logger.warning(
                "[%s] ticket %d names policy v%d, which this worker does not hold: it lapses",
                self.node.short_id,
                ticket.counter,
                ticket.policy_version,
            )
        return model

    def _report(self, report: GroupReport) -> None:
        self.reports.append(report)
        if self.on_group is not None:
            try:
                self.on_group(report)
            except Exception:  # printing what a validator said must never stop the worker
                logger.exception(
                    "[%s] reporting group %d failed; the worker goes on", self.node.short_id, report.counter
                )

    def generate(self, ticket: Ticket, model: CausalLM) -> GeneratedGroup:
        """Generate, prove and seal the group of `ticket` with its policy version's `model`."""
        grpo = self.config.grpo
        me = self.node.identity.peer_id_bytes
        counter, version = int(ticket.counter), int(ticket.policy_version)
        assignment = derive_assignment(
            self.config.run_id, version, me, counter, grpo.group_size, nonce=ticket.nonce
        )
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
        return GeneratedGroup(counter, version, tokens, seconds, sealed)

    def _judged(self, g: GeneratedGroup, validator: str, receipts: list[Receipt], error: str) -> GroupReport:
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

    def _submit(
        self, validator: LiveNode, generated: list[GeneratedGroup]
    ) -> list[tuple[list[Receipt], str]] | None:
        """Submit the groups, all at once, to the validator whose tickets they are, until each is judged
        or `submit_timeout_s` passes; per group its receipts and an error; None if stopped first.

        A group's ticket is good at its validator only, so an unanswered submission is retried there,
        `_SUBMIT_ATTEMPTS` times in all (a validator gone for good costs the groups in hand, not the
        worker's time); a group the validator could not judge yet (`unknown_version`: it restarted
        and does not hold the version again yet) is submitted again too.
        """
        outcomes: list[tuple[list[Receipt], str] | None] = [None] * len(generated)
        deadline = time.monotonic() + self.config.submit_timeout_s
        attempts = 0
        while not self._stop.is_set():
            attempts += 1
            todo = [i for i, outcome in enumerate(outcomes) if outcome is None]
            try:
                answers = self.node.call(
                    self._submit_to(validator, [generated[i].sealed for i in todo]),
                    timeout_s=self.config.submit_timeout_s + 15.0,
                )
            except Exception as exc:
                answers = [exc] * len(todo)
            late = time.monotonic() > deadline
            for i, answer in zip(todo, answers, strict=True):
                if isinstance(answer, BaseException):
                    logger.warning("[%s] validator %s: %s", self.node.short_id, validator.short_id, answer)
                    if late or attempts >= _SUBMIT_ATTEMPTS:
                        outcomes[i] = ([], f"not judged: {answer}")
                elif answer and all(r.verdict.reason == UNKNOWN_VERSION for r in answer):
                    if late or generated[i].version not in self.window.versions():
                        outcomes[i] = (answer, "")
                else:
                    outcomes[i] = (answer, "")
            done = [outcome for outcome in outcomes if outcome is not None]
            if len(done) == len(outcomes):
                if any(error for _, error in done):
                    self._failed(validator)
                return done
            self._waiting(
                f"validator {validator.short_id} has not judged {sum(o is None for o in outcomes)} group(s) "
                "yet; submitting them again"
            )
            self._stop.wait(_NO_VALIDATOR_WAIT_S)
        return None

    async def _submit_to(
        self, validator: LiveNode, sealed: list[bytes]
    ) -> list[list[Receipt] | BaseException]:
        """Dial `validator` at the addresses of its own signed record, then submit every group at once
        (a stream each): the receipts of each, or why it failed."""
        await connect_member(self.broadcast.dialer, validator)
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
