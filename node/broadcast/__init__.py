"""Weight broadcast: signed manifests and chunked gossip from many peers.

Map of the package:

- `broadcaster.WeightBroadcast`: a node's runtime service (`start`/`stop`); `publish`,
  `publish_file`, `fetch`, `load`, `follow`, `status`; wires the store, the service, the
  fetch and the DHT records.
- `config.BroadcastConfig`: every knob (chunk size, kept versions, in-flight limits, bans, upload cap).
- `store.ChunkStore` / `store.VersionEntry`: versions on disk with a chunk bitmap; verify-before-write; resume.
- `fetch.VersionFetch`: the multi-source scheduler (rarest first, per-peer limits, endgame, bans;
  it counts the verified chunks each source delivered); `fetch_progress.FetchProgress` is what it
  reports for progress bars.
- `transfer_receipts.sign_transfer_receipts`: after a fetch, one signed transfer receipt per source.
- `requests`: the requesting side of the protocol (one chunk, a bitmap stream, `NotHeld`, `SourceBusy`).
- `manifest_fetch`: a version's manifest from the publisher or any holder, checked against the pointer.
- `records.BroadcastRecords`: signed pointers and holder announcements in the DHT (find, announce, refresh).
- `dialing.HolderDialer`: dials only the holders a fetch picks, sparingly, never at others' addresses.
- `service.BroadcastService`: serves manifests, chunks and live bitmaps over libp2p streams (`rpc_*`).
- `watch_slots.WatchSlots`: the watch streams' own budget (per-peer cap, eviction of the heaviest).
- `publish`: safetensors serialisation, chunk hashing, manifest signing (`prepare_state_dict`, `prepare_file`).
- `wire`: size-capped framing and the upload token bucket (`RateLimiter`).
- `errors`: `DiskFull`, `WeightsUnavailable`, `StoreError`.

Wire formats and pure rules live in `protocol.manifest` and `protocol/broadcast.proto`; bans of
misbehaving peers in `node.bans`.
"""
