"""The averaging service: DiLoCo's outer-step round on the node's own event loop.

Trainers of a run exchange compressed pseudo-gradients over libp2p streams registered through
hivemind's public P2P API, agree on the set of contributions, and each aggregates the same
set with deterministic, Byzantine-robust arithmetic, so every member ends with bit-identical
outer parameters. Modules:

- `averager`: `GatherAverager`, the service as a trainer's synchronous averager and state source.
- `service`: `AveragingService`, one round per outer step (declare, gather, commit, aggregate).
- `members`: whom a round contacts (passing over declared members it could not reach), and
  whether the run has left a round behind.
- `intake`: `RoundIntake`, the checks a contribution or commit passes and the books of the
  rounds messages are taken for.
- `book`: `RoundBook`, what one round has received (contributions, commits) and its final set.
- `sealing`: round messages signed for exactly one round of one run.
- `outcome`: `tally_round`, decoding and aggregating a round's final set.
- `aggregate`, `rules`: the aggregation arithmetic (numpy float64, CenteredClip or mean, norm
  cap) and the rules' names and bounds.
- `codecs`, `bitfields`: pseudo-gradient codecs chosen by the run's config (dense int8;
  SparseLoCo-style top-k with Elias-Fano offsets, 2-bit values and error feedback) and their
  strictly decoded bit fields.
- `state_service`, `state_wire`, `budgets`: serving and downloading the outer state (late
  joiners, resyncs), under per-peer and total upload budgets.
- `outer_state`, `round_types`: what trainers agree on (`OuterState`) and what a round gives
  a trainer (`RoundOutcome`).
- `config`: `AveragingConfig`.
"""
