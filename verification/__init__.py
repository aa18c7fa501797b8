"""Verification of untrusted inference: TOPLOC proofs, seeded-sampling checks, rollout verdicts.

Map of the main names and where they live:

- `toploc`: `build_proofs`, `verify_proofs`, `ChunkCheck` (TOPLOC proofs, byte-compatible
  with the reference `toploc` 0.1.6, stricter on malformed input, plus a sign check).
- `errors`: `InvalidProofError` (a malformed proof or activations; the verdict rejects).
- `rollout`: `RolloutClaim` (what a worker submits), `CLAIM_DTYPES`.
- `sampling_check`: `check_sampling`, `SamplingCheck` (every token is the seeded sampler's).
- `policy`: `VerificationPolicy`, `DEFAULT_POLICY` (all thresholds, with their calibration).
- `verdict`: `verify_rollout`, `RolloutVerifier`, `judge`, `Verdict`, `RejectReason`.
- `scenarios`: `Lab` (honest and tampering workers on a TinyGPT, for tests and benchmarks).

The seeded sampler itself lives in `training.sampling`, the model in `training.model` and
the worker's generation loop in `training.generation`.
"""
