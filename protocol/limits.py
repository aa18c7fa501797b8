"""Size and time limits applied to everything that arrives from the network."""

from __future__ import annotations

MAX_ENVELOPE_BYTES = 8 * 1024
"""Largest signed envelope accepted in a DHT value (node records are well under 1 KiB)."""

MAX_NODE_RECORD_TTL_S = 300.0
"""A node record may not claim to stay valid longer than this; nodes refresh well before."""

MAX_CLOCK_SKEW_S = 30.0
"""Tolerance for peers' clocks when checking expiries."""

MAX_PUBLIC_NAME_CHARS = 64
MAX_ROLES = 4
MAX_ADDRESSES = 16
MAX_ADDRESS_CHARS = 256
MAX_RUN_ID_CHARS = 64

# --- weight broadcast (protocol.manifest, node.broadcast) ---

MIN_CHUNK_BYTES = 4 * 1024
"""Smallest chunk size a manifest may declare (keeps chunk counts and hash lists bounded)."""

MAX_CHUNK_BYTES = 64 * 1024 * 1024
"""Largest chunk size a manifest may declare; a chunk response is never buffered beyond it."""

MAX_WEIGHTS_BYTES = 1 << 40
"""Largest checkpoint a manifest may describe (1 TiB)."""

MAX_MANIFEST_BYTES = 32 * 1024 * 1024
"""Largest serialized signed manifest accepted from a peer, whatever its pointer declares."""

MAX_MANIFEST_TENSORS = 200_000
"""Most tensors a manifest may list."""

MAX_TENSOR_NAME_CHARS = 1024
"""Longest tensor name a manifest may hold."""

MAX_TENSOR_RANK = 16
"""Most dimensions a tensor in a manifest may have."""

MAX_BROADCAST_REQUEST_BYTES = 1024
"""Largest request frame a weight-broadcast peer accepts (requests are tiny)."""

MAX_RESPONSE_HEADER_BYTES = 1024
"""Largest response header frame accepted before a response payload."""

MAX_HAVE_BATCH = 4096
"""Most new-chunk indices one bitmap update may carry."""

MAX_WEIGHTS_POINTER_TTL_S = 3600.0
"""A weights pointer in the DHT may not claim validity longer than this; publishers refresh it."""

MAX_HOLDER_TTL_S = 300.0
"""A holder announcement may not claim validity longer than this; holders refresh it."""

MAX_UNSIGNED_VALUE_BYTES = 16
"""Largest value accepted outside the signed namespace: hivemind's averager declarations are one
msgpack scalar (a bool, a float step or None)."""

MAX_UNSIGNED_TTL_S = 3600.0
"""Furthest ahead an unsigned averager declaration may expire (a matchmaking round scheduled an
outer step ahead, or a state-sharing advertisement)."""

# --- averager streams (node.averaging.stream_limits, node.averaging.state_sync) ---

MAX_AVERAGER_STREAMS_PER_PEER = 16
"""Most averager streams one peer may hold open with us at once (a round needs one or two)."""

MAX_AVERAGER_REQUEST_BYTES = 64 * 1024
"""Cap on one inbound averager request other than a tensor part (join and download requests are
a few hundred bytes)."""

AVERAGER_MESSAGE_SLACK_BYTES = 64 * 1024
"""Headroom over the model's fp32 size allowed for one tensor-part message (protobuf framing and
codec metadata)."""

MAX_END_OF_STREAM_BYTES = 1024
"""Cap on an end-of-stream (error) frame; hivemind's is empty, an error message is short."""
