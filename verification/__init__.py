"""Verification of untrusted inference: seeded-sampling checks and rollout verdicts over TOPLOC proofs.

Map of the main names and where they live:

- `errors`: `InvalidProofError` (a malformed proof or activations; the verdict rejects),
  defined in `protocol.errors` beside the proof format.
- `rollout`: `RolloutClaim` (what a worker submits), `CLAIM_DTYPES`.
- `sampling_check`: `check_sampling`, `SamplingCheck` (every token is the seeded sampler's).
- `policy_file`: reads and writes a run's `RunVerification` (the limits per precision and device
  class, defined in `protocol.verification_policy` with the built-in `EXACT_POLICY`, `PAPER_POLICY`);
- `calibration`: measures honest noise and cheats on a model and derives a `RunVerification`.
- `recompute`: `recompute`, `recompute_batch` (the hidden states and logits a claim is checked against).
- `verdict`: `verify_rollout`, `RolloutVerifier`, `judge`, `Verdict`, `RejectReason`.
- `validator`: `Validator` (judges a worker's `RolloutGroup` of an RL run; its sealed verdicts also go
  to `on_verdicts`, e.g. the node's ledger), `VerifiedRollout`,
  `ValidatorStats`; its parts: `rollout_checks` (assignment, verdict, recomputed reward, reason
  codes), `rollout_wire` (a parsed wire `Rollout` -> `RolloutClaim`; parsing itself is
  `protocol.rollout_messages.parse_rollout`), `verifier_window` (the versions held),
  `worker_accounts` (counters, abandoned assignments, per-worker counts) (verdicts are sealed by `protocol.rollout_messages.seal_verdict`).

The TOPLOC proof format itself (`build_proofs`, `verify_proofs`, `ChunkCheck`) lives in
`protocol.toploc`; the seeded sampler in `training.sampling`, the model in `training.model`
and the worker's generation loop in `training.generation`. Honest and tampering workers for
tests and benchmarks are in `tests/helpers/scenarios.py`.
"""
