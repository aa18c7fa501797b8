"""DiLoCo's averaging transport: one robust all-reduce of pseudo-gradients per outer step, and state sharing.

Map of the package:

- `averager.DiLoCoAverager`: a trainer's hivemind averager (its own process); bans of peers
  that sent bad parts (`node.bans.BanList`), the all-reduce of a round, bytes sent. Implements
  `training.diloco.RoundAverager` and `StateSource` through the two mixins below.
- `rounds.Rounds`: `prepare_round`, `start_average`, `average`, `cancel_round`; a round in
  flight is a `PendingRound`; round results are `RoundOutcome` (`PendingAverage`, `DoneAverage`).
- `state_sync.StateSharing`: `publish_step`, `peer_steps`, `set_state_provider`, `fetch_state`.
- `runner.RobustAllReduceRunner`: equal weights, checked parts, robust per-part aggregation,
  bit-identical averages; `global_norm`, `norm_bound`.
- `audit`: the reducer audit (each part reduced twice, by two members; parts they disagree on are left out).
- `robust`: the reducers' aggregation rules (`centered_clip`, the default; `mean`), `aggregate`.
- `outer_state.OuterState`, `state_hash`: the state peers agree on and download.
- `codecs`: fp32, fp16 and blockwise int8 wire codecs (`codec_for`, `decode_tensor`, `install_hivemind_codecs`).
- `traffic.count_sent_bytes`: counts what a process writes to libp2p streams.
- `stream_limits`: caps, timeouts and per-peer limits on every stream the averager process accepts.

The DHT keys it reads are built in `protocol.dht_keys` (`averaging_prefix`, `all_averagers_key`).
"""
