"""The running peer: identity, config, DHT membership, P2P services, DiLoCo averaging, local swarm.

- `identity`: `Identity`, `load_or_create_identity` (Ed25519 key file in libp2p format, 0600, lock).
- `config`: `NodeConfig`, `load_config` (flags > TOML file > defaults; unknown keys are errors).
- `dht_node`: `start_dht` (p2pd in its own process group), `bootstrap` (per-seed retries and report).
- `membership`: `Membership` (signed node record, refresh, clean leave), `discover`, `LiveNode`.
- `node`: `HivenetNode`, which wires the above and writes the status snapshot.
- `status`: `NodeStatusSnapshot`, the status file and `StatusServer` (JSON health over HTTP).
- `reachability`: the seeds' dial-back service and `call_dial_back` (used by `hivenet doctor`).
- `shutdown`: `StopRequest` (first Ctrl-C asks loops to finish; a second one forces).
- `logs`: `configure_logging` (short PeerID on every line).
- `swarm`: `LocalSwarm` (seed + N real node processes on 127.0.0.1 with add/kill/stop), `wait_until`.
- `averaging/`: DiLoCo's averaging transport, `DiLoCoAverager` (one all-reduce per outer step with
  equal weights and refusal of bad parts, state sharing; see its own map).
- `broadcast/`: the weight broadcast (see its own map).
"""
