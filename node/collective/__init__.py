"""The averaging service: DiLoCo's outer-step round on the node's own event loop.

Trainers of a run exchange compressed pseudo-gradients over libp2p streams registered through
hivemind's public P2P API, agree on the set of contributions, and each aggregates the same
set with deterministic, Byzantine-robust arithmetic, so every member ends with bit-identical
outer parameters. Modules:

- `codecs`: pseudo-gradient codecs chosen by the run's config (dense int8; SparseLoCo-style
  top-k with 2-bit values and error feedback).
- `state_service`: serving and downloading the outer state (late joiners, resyncs), under
  per-peer and total upload budgets.
"""
