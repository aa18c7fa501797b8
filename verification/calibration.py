"""Calibration: honest noise and cheats measured on one (model, precision, device), and limits between them.

`calibrate` generates honest rollouts the way workers do (a group's seeds decoded together with the
key/value cache, batch sizes 1, 4 and 16, prompts of the run's task, completions of many lengths,
the worker on one thread count and the validator on another) and re-verifies them the way
validators do (one batched prefill: `recompute_batch`). Each rollout gives its worst chunk's TOPLOC
figures, its largest sampling gap and its near-tie deviations (`RolloutFigures`); the worker's own
logits against the validator's give the honest logit noise.

The limits (`derive_limits`):

* the near-tie tolerance is 3 times the largest honest logit error relative to the row's largest
  |logit| (an honest gap is at most twice that error: one error on each of the two logits), zero
  when the backend is exact;
* then the `near_tie` cheat is generated against that tolerance, with every other cheat class;
* each TOPLOC figure and the near-tie count gets the midpoint between its honest maximum and the
  smallest value above it among the cheat rollouts (or, where no cheat exceeds it, its honest
  maximum plus as much again, at least one unit), so that every cheat rollout that leaves the
  honest range on some figure is rejected by that figure;
* then each TOPLOC limit is widened to that wider value wherever every cheat rollout stays
  rejected (another figure catches it), which leaves honest noise room beyond what the
  calibration saw. The near-tie count is not widened, nor raised above its honest maximum
  where no cheat exceeds it: each deviation it allows is a token a worker may steer.

A cheat rollout that stays inside the honest range on every figure cannot be told from honest
noise by any limit. Where more than 1% of a class's rollouts do (`CalibrationPlan.min_detection`),
`calibrate` raises `CalibrationOverlap`, naming the classes, and no policy is written; below that,
the table shows the class's detection rate (a short rollout, a token or two, carries little
evidence either way). `Calibration.table()` prints the figures: honest maxima, limits, and each class's minima
and detection rate.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from protocol.errors import HivenetError
from protocol.toploc import ChunkCheck, verify_proofs_batch
from protocol.verification_policy import VerificationPolicy
from training.causal_lm import CausalLM
from verification.cheats import Assignment, RolloutFactory, cheat_classes
from verification.recompute import recompute_batch
from verification.rollout import RolloutClaim
from verification.sampling_check import SamplingCheck, check_sampling_batch
from verification.verdict import decide

__all__ = [
    "FIGURES",
    "Calibration",
    "CalibrationOverlap",
    "CalibrationPlan",
    "RolloutFigures",
    "calibrate",
    "derive_limits",
    "measure",
    "worker_threads",
]

NEAR_TIE_NOISE_FACTOR = 3.0
"""The near-tie tolerance, in units of the largest honest relative logit error (an honest gap is at
most 2 of them; the rest is margin)."""

CHEAT_BATCH = 4
"""Rollouts a cheat generates per assignment."""

INT_FIGURES = ("exp_mismatches", "sign_mismatches", "value_mismatches", "near_tie_deviations")
FLOAT_FIGURES = ("mant_err_mean", "mant_err_median")
FIGURES = (*INT_FIGURES[:3], *FLOAT_FIGURES, "sampling_gap", INT_FIGURES[3])
"""The figures of a rollout, in the order tables print them."""


class CalibrationOverlap(HivenetError):
    """Too many of some cheat's rollouts look honest on every figure: no policy is written."""

    def __init__(self, message: str, calibration: Calibration) -> None:
        super().__init__(message)
        self.calibration = calibration
        """What was measured (to print the figures behind the refusal)."""


@dataclass(frozen=True)
class RolloutFigures:
    """What verifying one rollout measured: its worst chunk's TOPLOC figures and its sampling figures."""

    exp_mismatches: int
    sign_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    value_mismatches: int
    sampling_gap: float
    """Largest gap of a token below the seeded choice, relative to its row's largest |logit| (inf: a
    token outside the nucleus)."""
    near_tie_deviations: int
    """Tokens that are not the seeded choice on the validator's logits."""
    tokens: int
    checks: tuple[ChunkCheck, ...] = field(repr=False, default=())
    sampling: SamplingCheck | None = field(repr=False, default=None)
    scales: torch.Tensor | None = field(repr=False, default=None)
    """Each row's largest |logit| (to turn a relative tolerance into the check's)."""

    def value(self, figure: str) -> float:
        return float(getattr(self, figure))


def measure(
    claims: Sequence[RolloutClaim], model: CausalLM
) -> tuple[list[RolloutFigures], list[torch.Tensor]]:
    """Each claim's figures as a validator computes them (one batched pass of `model`, which must be in the
    claims' precision), and the validator's logits (for the noise against the worker's)."""
    rows = recompute_batch(claims, model)
    toploc = verify_proofs_batch(
        [(hidden.to(torch.bfloat16), list(c.proofs)) for c, (hidden, _) in zip(claims, rows, strict=True)]
    )
    out: list[RolloutFigures] = []
    by_params: dict[object, list[int]] = {}
    for i, claim in enumerate(claims):
        by_params.setdefault(claim.sampling, []).append(i)
    sampling: dict[int, SamplingCheck] = {}
    for members in by_params.values():
        params = claims[members[0]].sampling
        checks = check_sampling_batch(
            [rows[i][1] for i in members],
            [torch.tensor(claims[i].completion_ids) for i in members],
            params,
            [claims[i].seed for i in members],
            abs_tol=0.0,
            rel_tol=0.0,
        )
        sampling.update(zip(members, checks, strict=True))
    for i, claim in enumerate(claims):
        chunks = toploc[i]
        if not isinstance(chunks, list):
            raise ValueError(f"a generated rollout has malformed proofs: {chunks}")
        scales = rows[i][1].double().abs().amax(dim=-1).clamp(min=1e-30)
        gaps = torch.from_numpy(sampling[i].gaps)
        out.append(
            RolloutFigures(
                exp_mismatches=max(c.exp_mismatches for c in chunks),
                sign_mismatches=max(c.sign_mismatches for c in chunks),
                mant_err_mean=max(c.mant_err_mean for c in chunks),
                mant_err_median=max(c.mant_err_median for c in chunks),
                value_mismatches=max(c.value_mismatches for c in chunks),
                sampling_gap=float((gaps / scales).max()),
                near_tie_deviations=sampling[i].deviations,
                tokens=len(claim.completion_ids),
                checks=tuple(chunks),
                sampling=sampling[i],
                scales=scales,
            )
        )
    return out, [logits for _, logits in rows]


def logit_noise(worker_logits: torch.Tensor, validator_logits: torch.Tensor) -> float:
    """Largest error of the worker's logits against the validator's, relative to the row's largest |logit|."""
    w, v = worker_logits.double(), validator_logits.double()
    return float(((w - v).abs().amax(dim=-1) / v.abs().amax(dim=-1).clamp(min=1e-30)).max())


def _midpoint(honest: float, nearest: float | None, integer: bool) -> float:
    if nearest is None:
        return honest + max(honest, 1.0) if integer else honest + max(honest, 0.5)
    if integer:
        return float((int(honest) + int(nearest)) // 2)
    return honest + (nearest - honest) / 2


_POLICY_FIELDS = {
    "exp_mismatches": "max_exp_mismatches",
    "sign_mismatches": "max_sign_mismatches",
    "value_mismatches": "max_value_mismatches",
    "near_tie_deviations": "max_near_tie_deviations",
    "mant_err_mean": "max_mant_err_mean",
    "mant_err_median": "max_mant_err_median",
}


def derive_limits(
    honest: Sequence[RolloutFigures],
    cheats: Mapping[str, Sequence[RolloutFigures]],
    *,
    near_tie_rel_tol: float,
    near_tie_tokens: int,
    cheat_claims: Mapping[str, Sequence[RolloutClaim]] | None = None,
) -> tuple[VerificationPolicy, dict[str, dict[str, float]]]:
    """The policy between honest maxima and the nearest cheats (see the module docstring), and per figure
    `{honest_max, limit, nearest_cheat}` (nearest_cheat NaN where no cheat exceeds the honest maximum).

    With `cheat_claims` (the claims of `cheats`' figures), each limit is then widened to its honest
    maximum plus as much again wherever that rejects every cheat rollout the midpoints reject (another
    figure catches them): a limit right at the honest maximum would reject the first honest rollout
    that goes one step further than the calibration saw."""
    limits: dict[str, float] = {}
    report: dict[str, dict[str, float]] = {}
    for figure in (*INT_FIGURES, *FLOAT_FIGURES):
        h = max(r.value(figure) for r in honest)
        above = [r.value(figure) for rows in cheats.values() for r in rows if r.value(figure) > h]
        nearest = min(above) if above else None
        # each allowed deviation is a token a worker may steer: no more than honest noise was seen to need
        steerable = figure == "near_tie_deviations" and nearest is None
        limits[figure] = h if steerable else _midpoint(h, nearest, figure in INT_FIGURES)
        report[figure] = {
            "honest_max": h,
            "limit": limits[figure],
            "nearest_cheat": math.nan if nearest is None else nearest,
        }
    top = 128
    policy = VerificationPolicy(
        max_exp_mismatches=min(top, int(limits["exp_mismatches"])),
        max_sign_mismatches=min(top, int(limits["sign_mismatches"])),
        max_mant_err_mean=limits["mant_err_mean"],
        max_mant_err_median=limits["mant_err_median"],
        max_value_mismatches=min(top, int(limits["value_mismatches"])),
        sampling_abs_tol=0.0,
        sampling_rel_tol=near_tie_rel_tol,
        max_near_tie_deviations=int(limits["near_tie_deviations"]),
        near_tie_tokens=near_tie_tokens,
    )
    if cheat_claims is not None:
        policy = _widened(policy, report, cheats, cheat_claims)
    gap_h = max(r.sampling_gap for r in honest)
    gap_above = [
        r.sampling_gap for rows in cheats.values() for r in rows if r.sampling_gap > near_tie_rel_tol
    ]
    report["sampling_gap"] = {
        "honest_max": gap_h,
        "limit": near_tie_rel_tol,
        "nearest_cheat": min(gap_above) if gap_above else math.nan,
    }
    return policy, report


def _widened(
    policy: VerificationPolicy,
    report: dict[str, dict[str, float]],
    cheats: Mapping[str, Sequence[RolloutFigures]],
    claims: Mapping[str, Sequence[RolloutClaim]],
) -> VerificationPolicy:
    pairs = [(c, f) for kind in cheats for c, f in zip(claims[kind], cheats[kind], strict=True)]
    caught = sum(rejected(c, f, policy) for c, f in pairs)
    for figure, name in _POLICY_FIELDS.items():
        if figure == "near_tie_deviations":
            continue  # an allowed deviation is a steerable token: kept at what honest noise needs
        row = report[figure]
        wide = _midpoint(row["honest_max"], None, figure in INT_FIGURES)
        if wide <= row["limit"]:
            continue
        value = min(128, int(wide)) if figure in INT_FIGURES and name != "max_near_tie_deviations" else wide
        trial = policy.model_copy(update={name: int(value) if figure in INT_FIGURES else value})
        if sum(rejected(c, f, trial) for c, f in pairs) >= caught:
            policy, row["limit"] = trial, float(value)
    return policy


def rejected(claim: RolloutClaim, figures: RolloutFigures, policy: VerificationPolicy) -> bool:
    """Whether the verdict rejects a rollout with these figures under `policy` (the verdict's own rule)."""
    assert figures.sampling is not None and figures.scales is not None
    tolerances = (policy.sampling_abs_tol + policy.sampling_rel_tol * figures.scales).numpy()
    check = SamplingCheck(gaps=figures.sampling.gaps, tolerances=tolerances)
    return not decide(claim, figures.checks, check, policy=policy).accepted


@contextlib.contextmanager
def worker_threads(threads: int) -> Iterator[None]:
    """Run the block's torch ops on `threads` threads (the process-wide setting, restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class CalibrationPlan:
    """How many rollouts of each kind, in which shapes."""

    honest_rollouts: int = 512
    cheat_rollouts: int = 32
    """Rollouts per cheat class (a class that alters few rollouts, `near_tie`, gets up to 8x the tries)."""
    batch_sizes: tuple[int, ...] = (1, 4, 16)
    thread_counts: tuple[int, ...] = (1, 2)
    """Worker and validator take turns on these (each on a different one when there are two)."""
    min_new_tokens: int = 8
    seed: int = 0
    min_detection: float = 0.99
    """The share of each cheat class's calibration rollouts the derived limits must reject, or nothing
    is written (a cheat rollout inside the honest range on every figure is an overlap)."""


@dataclass
class Calibration:
    """Everything a calibration measured, and the policy derived from it."""

    dtype: str
    device: str
    honest: list[RolloutFigures]
    cheats: dict[str, list[RolloutFigures]]
    cheat_claims: dict[str, list[RolloutClaim]]
    near_tie_rel_tol: float
    honest_logit_noise: float
    policy: VerificationPolicy
    report: dict[str, dict[str, float]]
    tries: dict[str, int]
    """Rollouts each cheat class generated (more than it altered for `near_tie` and `tail_altered`)."""
    seconds: float

    def detection(self, kind: str) -> float:
        """The fraction of the class's altered rollouts the policy rejects (NaN if it altered none)."""
        pairs = list(zip(self.cheat_claims[kind], self.cheats[kind], strict=True))
        if not pairs:
            return math.nan
        return sum(rejected(c, f, self.policy) for c, f in pairs) / len(pairs)

    def margins(self) -> dict[str, float]:
        """Per figure, how far the limit sits below the nearest cheat, as a fraction of that cheat's figure."""
        return {
            figure: (row["nearest_cheat"] - row["limit"]) / row["nearest_cheat"]
            for figure, row in self.report.items()
            if not math.isnan(row["nearest_cheat"]) and row["nearest_cheat"] > 0
        }

    def table(self) -> list[list[str]]:
        """Rows for a printed table: header, honest maxima, limits, then each class's minima and detection."""
        header = ["rollouts", *(_SHORT[f] for f in FIGURES), "altered", "detected"]
        rows = [
            header,
            [
                "honest max",
                *(_fmt(max(r.value(f) for r in self.honest)) for f in FIGURES),
                str(len(self.honest)),
                "-",
            ],
        ]
        rows.append(["limit", *(_fmt(self.report[f]["limit"]) for f in FIGURES), "", ""])
        for kind, figures in self.cheats.items():
            if not figures:
                rows.append([kind, *("-" for _ in FIGURES), f"0/{self.tries[kind]}", "n/a"])
                continue
            mins = [_fmt(min(r.value(f) for r in figures)) for f in FIGURES]
            rows.append([kind, *mins, f"{len(figures)}/{self.tries[kind]}", f"{self.detection(kind):.3f}"])
        return rows


_SHORT = {
    "exp_mismatches": "exp",
    "sign_mismatches": "sign",
    "value_mismatches": "values",
    "mant_err_mean": "mant mean",
    "mant_err_median": "mant med",
    "sampling_gap": "gap",
    "near_tie_deviations": "ties",
}


def _fmt(x: float) -> str:
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}" if x != int(x) else str(int(x))


PromptSource = Callable[[int], list[int]]
"""`prompt(seed) -> token ids`: the run task's prompts."""


def _assignment(
    rng: random.Random, prompts: PromptSource, max_new_tokens: int, size: int, plan: CalibrationPlan
) -> Assignment:
    return Assignment(
        prompt=prompts(rng.randrange(2**31)),
        seeds=[rng.randrange(2**64) for _ in range(size)],
        max_new_tokens=rng.randint(min(plan.min_new_tokens, max_new_tokens), max_new_tokens),
    )


def calibrate(
    factory: RolloutFactory,
    prompts: PromptSource,
    max_new_tokens: int,
    plan: CalibrationPlan = CalibrationPlan(),
    *,
    progress: Callable[[str, int, int], None] | None = None,
) -> Calibration:
    """Measure `factory`'s honest rollouts and cheats, derive the limits, and check that they separate them.

    Raises `CalibrationOverlap` (carrying what was measured) when the limits reject less than
    `plan.min_detection` of some class's rollouts.
    """
    started = time.perf_counter()
    rng = random.Random(plan.seed)
    verifier_model = factory.model_in("policy", factory.dtype)
    threads = plan.thread_counts
    honest: list[RolloutFigures] = []
    noise = 0.0
    turn = 0
    while len(honest) < plan.honest_rollouts:
        size = min(plan.batch_sizes[turn % len(plan.batch_sizes)], plan.honest_rollouts - len(honest))
        a = _assignment(rng, prompts, max_new_tokens, size, plan)
        with worker_threads(threads[turn % len(threads)]):
            generated = factory.honest(a)
        with worker_threads(threads[(turn + 1) % len(threads)]):
            figures, logits = measure([c for c, _ in generated], verifier_model)
        honest.extend(figures)
        noise = max([noise, *(logit_noise(g.logits, v) for (_, g), v in zip(generated, logits, strict=True))])
        turn += 1
        if progress:
            progress("honest", len(honest), plan.honest_rollouts)
    tol = NEAR_TIE_NOISE_FACTOR * noise
    factory.near_tie_rel_tol = tol
    cheats: dict[str, list[RolloutFigures]] = {}
    claims: dict[str, list[RolloutClaim]] = {}
    tries: dict[str, int] = {}
    classes = cheat_classes(factory.dtype)
    for n, kind in enumerate(classes):
        cheats[kind], claims[kind], tries[kind] = [], [], 0
        while len(claims[kind]) < plan.cheat_rollouts and tries[kind] < 8 * plan.cheat_rollouts:
            a = _assignment(rng, prompts, max_new_tokens, CHEAT_BATCH, plan)
            with worker_threads(threads[0]):
                made = factory.cheat(kind, a)
            tries[kind] += len(made)
            altered = [c for c in made if c is not None][: plan.cheat_rollouts - len(claims[kind])]
            if altered:
                with worker_threads(threads[-1]):
                    cheats[kind].extend(measure(altered, verifier_model)[0])
                claims[kind].extend(altered)
            if kind != "near_tie" and tries[kind] >= 2 * plan.cheat_rollouts and not claims[kind]:
                break
        if progress:
            progress(kind, n + 1, len(classes))
    policy, report = derive_limits(
        honest, cheats, near_tie_rel_tol=tol, near_tie_tokens=max_new_tokens, cheat_claims=claims
    )
    result = Calibration(
        dtype=factory.dtype,
        device=factory.device_class,
        honest=honest,
        cheats=cheats,
        cheat_claims=claims,
        near_tie_rel_tol=tol,
        honest_logit_noise=noise,
        policy=policy,
        report=report,
        tries=tries,
        seconds=time.perf_counter() - started,
    )
    weak = {kind: d for kind in cheats if (d := result.detection(kind)) < plan.min_detection}
    if weak:
        raise CalibrationOverlap(
            "no limits separate honest noise from "
            + ", ".join(f"{kind} (limits reject {d:.1%} of its rollouts)" for kind, d in weak.items())
            + f" on {factory.dtype}/{factory.device_class}, where {plan.min_detection:.0%} is required; no policy "
            "written. Calibrate another precision, or with more rollouts (the limits sit between the figures seen)",
            result,
        )
    return result
