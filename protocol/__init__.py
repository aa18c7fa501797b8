"""Wire formats and pure rules, no I/O. Everything that crosses the network is defined here.

- `errors`: `HivenetError` and its subclasses (`ConfigError`, `IdentityError`, `InvalidMessage`,
  `InvalidProofError`, `PeerUnreachable`).
- `version`: `SOFTWARE_VERSION`, `PROTOCOL_VERSION`.
- `hivenet.proto` / `hivenet_pb2`: envelopes and node records (regenerate with `scripts/gen_proto.sh`).
- `envelope`: `seal` / `open_envelope`: Ed25519-signed messages bound to domain, version, run, key, expiry.
- `peer_keys`: PeerIDs that inline Ed25519 public keys, and back.
- `dht_keys`: every DHT key string (`node_records_key`, `signed_subkey`, ...).
- `limits`: size and TTL caps for untrusted input.
- `node_record`: `NodeRecord`, `Role`, `Capabilities`: strict typed node records.
- `address_attestation`: `seal_attestation` / `open_attestation`: a seed's signed word that a PeerID
  was reached at some addresses (what a public swarm's peers are dialled at).
- `record_validator`: `SignedRecordValidator`, the hivemind DHT validator; `register_domain`.
- `broadcast.proto` / `manifest`: weight manifests, pointers and chunk messages.
- `toploc`: `build_proofs`, `verify_proofs`, `ChunkCheck`: TOPLOC proofs (byte-compatible with the
  reference `toploc` 0.1.6, stricter on malformed input, plus a sign check); spec in `docs/toploc-spec.md`.
"""
