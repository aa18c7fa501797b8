"""The running peer: identity, config, DHT membership, P2P services, DiLoCo averaging, local swarm.

- `runtime`: `NodeRuntime` (one event loop per process; `call` from sync code, `offload` and `in_dht`
  from the loop) and the `Service` lifecycle every component below follows.
- `identity`: `Identity`, `load_or_create_identity` (Ed25519 key file in libp2p format, 0600, lock).
- `config`: `NodeConfig`, `load_config` (flags > `HIVENET_*` environment > TOML file > defaults;
  unknown keys are errors), `env_settings`, `config_table`.
- `dht_node`: `start_dht` (p2pd in its own process group), `bootstrap` (per-seed retries and report).
- `signed_records`: `SignedRecords` (store our signed DHT values, read others' verified ones).
- `dht_guard`: `GuardedDHTProtocol` (store/find requests checked before hivemind; bad senders banned).
- `membership`: `Membership` service (signed node record, refresh, clean leave), `discover`, `LiveNode`.
- `bans`: `BanList` (growing bans with counted reasons, shared by every service).
- `node`: `HivenetNode`, which owns the runtime, hosts the services and writes the status snapshot.
- `status`: `NodeStatusSnapshot`, the status file and `StatusServer` service (JSON health and
  Prometheus `/metrics` over HTTP).
- `metrics`: `NodeMetrics` (one registry per node: `hivenet_*` counters, gauges, a histogram),
  `TransferMetrics` (what the weight broadcast counts), `MetricsFigures` (the same for the JSON status).
- `reachability`: the seeds' dial-back service and `call_dial_back` (used by `hivenet doctor`);
  a seed that reaches a node answers with a signed address attestation.
- `attestations`: `AttestationBook` (this node's trusted attesters, its initial peers, and the
  attestations its seeds gave it) and `AttestationRenewal` (re-checks before they lapse).
- `shutdown`: `StopRequest` (first Ctrl-C asks loops to finish; a second one forces).
- `logs`: `configure_logging` (short PeerID on every line).
- `swarm`: `LocalSwarm` (seed + N real node processes on 127.0.0.1 with add/kill/stop), `wait_until`.
- `collective/`: the averaging service, DiLoCo's outer-step round on the node's event loop
  (`GatherAverager`: signed declarations, gathered compressed contributions, commits, robust
  aggregation every member computes to the same bits, outer-state serving; see its own map).
- `broadcast/`: the weight broadcast (see its own map).
- `ledger/`: the receipts ledger and credit (see its own map).
- `receipts/`: the receipts exchange, `ReceiptExchange` (a node's own receipts into its ledger, the
  ledger served page by page, bounded pulls from live nodes; see its own map).
- `dashboard/`: the contributor dashboard's data layer and HTTP server.
- `process_locks`: `RobustLock`, which `dht_node` puts in place of hivemind's cross-process
  future locks before any DHT starts (a process killed while holding one of those hangs the others).
"""
