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

MAX_ATTESTATIONS = 3
"""Most address attestations a record or announcement carries: the newest of each of a node's few seeds."""

MAX_ATTESTATION_BYTES = 640
"""Largest sealed address attestation accepted: four of the longest addresses
(`/ip6/<39 chars>/tcp/65535`) make one of about 430 bytes."""

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

# --- receipts (protocol.receipts, protocol.rollout_messages) ---

RECEIPT_TTL_S = 30 * 24 * 3600.0
"""Validity of every receipt, a sealed verdict included, counted from its issue time: a receipt is
shown long after the work (contribution accounting), and a ledger admits it until then."""

# --- receipts exchange (protocol/receipts_exchange.proto, node.receipts) ---

MAX_RECEIPTS_PER_PAGE = 256
"""Most receipts one exchange response may carry; a puller asks for at most this many per request."""

MAX_RECEIPTS_REQUEST_BYTES = 256
"""Largest receipts request frame a server reads (a run id and two integers)."""

MAX_RECEIPT_ENVELOPE_BYTES = 2048
"""Largest receipt envelope (the same bound as `protocol.receipts.MAX_RECEIPT_BYTES`)."""

MAX_RECEIPTS_RESPONSE_BYTES = MAX_RECEIPTS_PER_PAGE * (MAX_RECEIPT_ENVELOPE_BYTES + 4) + 4 * 1024
"""Largest receipts response frame a puller reads: a full page of the largest receipts, or an error."""

# --- rollout transport (protocol.rollout_messages, node.rollouts) ---

MAX_ROLLOUTS_PER_GROUP = 64
"""Most completions one submitted group may hold (GRPO groups are 8 by default)."""

MAX_ROLLOUT_PROMPT_TOKENS = 4096
"""Longest prompt a rollout may carry."""

MAX_ROLLOUT_COMPLETION_TOKENS = 4096
"""Longest completion a rollout may carry (a validator recomputes every token, so this bounds its work)."""

MAX_ROLLOUT_TOKEN_ID = 2**31 - 1
"""Largest token id accepted (the same bound as `verification.rollout.RolloutClaim`)."""

MAX_ROLLOUT_PROOF_BYTES = 4096
"""Cap on one TOPLOC proof (258 bytes for k = 128; the same bound as `verification.rollout.MAX_PROOF_BYTES`)."""

MIN_ROLLOUT_PROOF_BYTES = 4
"""Shortest proof that can be well formed: a 2-byte modulus and at least one 2-byte coefficient."""

MAX_ROLLOUT_TEMPERATURE = 100.0
"""Highest sampling temperature a rollout may claim (the bound of `training.sampling.SamplingParams`)."""

MAX_TASK_NAME_CHARS = 64
"""Longest task name a group may carry."""

MAX_ROLLOUT_GROUP_BYTES = 16 * 1024 * 1024
"""Largest sealed rollout group accepted (64 completions of 4096 tokens with 258-byte proofs are about
3 MiB; the cap leaves room for larger proofs). Intakes may configure a lower cap."""

MAX_GROUPS_PER_SUBMISSION = 4
"""Most groups a worker submits at once, each on a stream of its own (a validator's submit intake
lets one peer hold this many streams)."""

TICKET_NONCE_BYTES = 16
"""Length of a ticket's nonce (random bytes the assignment's prompt and seeds derive from)."""

MAX_OPEN_TICKETS = 2 * MAX_GROUPS_PER_SUBMISSION
"""Most tickets a worker may hold open at one validator (issued, not yet judged or abandoned)."""

MAX_TICKET_REQUEST_BYTES = 256
"""Largest ticket request frame a validator reads (a run id and a count)."""


MAX_VERDICT_REASON_CHARS = 64
"""Longest reason code a verdict may carry."""

MAX_VERDICT_DETAIL_CHARS = 400
"""Longest human-readable detail a verdict may carry: `seal_verdict` cuts a longer one, so that a
sealed verdict, even of 4-byte characters, stays under the ledger's receipt size cap
(`protocol.receipts.MAX_RECEIPT_BYTES`)."""

MAX_VERDICT_BAN_S = 7 * 24 * 3600.0
"""Longest ban a verdict may announce (validators ban for at most a day by default)."""

ROLLOUT_GROUP_TTL_S = 600.0
"""Validity of a sealed group: a validator refuses a submission signed for longer, or expired."""


ROLLOUT_FORWARD_TTL_S = 600.0
"""Validity of a validator's forward of a verified group to a trainer."""

MAX_SUBMIT_ERROR_CHARS = 1024
"""Longest error text a submit or forward response may carry."""

MAX_SUBMIT_RESPONSE_BYTES = (
    MAX_ROLLOUTS_PER_GROUP * (MAX_ENVELOPE_BYTES + 8) + 4 * MAX_SUBMIT_ERROR_CHARS + 64
)
"""Largest submit response frame a worker reads: one sealed verdict per rollout, or an error."""

MAX_TICKET_RESPONSE_BYTES = MAX_OPEN_TICKETS * (TICKET_NONCE_BYTES + 32) + 4 * MAX_SUBMIT_ERROR_CHARS + 64
"""Largest ticket response frame a worker reads: the open tickets, or an error."""

MAX_ROLLOUT_FORWARD_BYTES = MAX_ROLLOUT_GROUP_BYTES + MAX_ROLLOUTS_PER_GROUP * (MAX_ENVELOPE_BYTES + 8) + 4096
"""Largest sealed forward accepted: the worker's group, the verdicts and the forward envelope's own fields."""

MAX_FORWARD_RESPONSE_BYTES = 4 * MAX_SUBMIT_ERROR_CHARS + MAX_RECEIPT_ENVELOPE_BYTES + 32
"""Largest forward response frame a validator reads: an error, or the trainer's validation receipt."""
