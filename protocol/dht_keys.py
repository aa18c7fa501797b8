"""The DHT key schema: every key string hivenet stores or reads is built here.

Keys carry the protocol version and the run id, so runs and incompatible versions never
read each other's records. Subkeys of signed records carry the signer's PeerID, which is
how the record validator recognises the records it must police.
"""

from __future__ import annotations

import re

from protocol.errors import ConfigError
from protocol.limits import MAX_RUN_ID_CHARS
from protocol.version import PROTOCOL_VERSION

SIGNED_SUBKEY_PREFIX = "hn:"
"""Subkeys starting with this are `hn:<base58 PeerID>`: the value must be an envelope signed by that peer."""

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def validate_run_id(run_id: str) -> str:
    """Return `run_id` if it is a valid run name, else raise ConfigError saying what is allowed."""
    if not (0 < len(run_id) <= MAX_RUN_ID_CHARS) or not _RUN_ID_RE.match(run_id):
        raise ConfigError(
            f"invalid run id {run_id!r}: use 1-{MAX_RUN_ID_CHARS} letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return run_id


def node_records_key(run_id: str) -> str:
    """The DHT key under which every node of `run_id` publishes its node record (one subkey per node)."""
    return f"hivenet/v{PROTOCOL_VERSION}/{validate_run_id(run_id)}/nodes"


def signed_subkey(peer_id_base58: str) -> str:
    """The subkey a peer uses for its own signed value under a shared key."""
    return SIGNED_SUBKEY_PREFIX + peer_id_base58


# --- weight broadcast (node.broadcast) ---


def weights_pointer_key(run_id: str) -> str:
    """Where each authorised publisher of `run_id` keeps the signed pointer to its latest version."""
    return f"hivenet/v{PROTOCOL_VERSION}/{validate_run_id(run_id)}/weights/latest"


def weights_version_key(run_id: str, version: int) -> str:
    """Where the signed pointer to one version's manifest is kept (one subkey per publisher)."""
    return f"hivenet/v{PROTOCOL_VERSION}/{validate_run_id(run_id)}/weights/{int(version)}/pointer"


def weights_holders_key(run_id: str, version: int) -> str:
    """Where holders of a version announce themselves (one short-lived subkey per holder)."""
    return f"hivenet/v{PROTOCOL_VERSION}/{validate_run_id(run_id)}/weights/{int(version)}/holders"


# --- DiLoCo averaging (node.collective) ---


def averaging_prefix(run_id: str) -> str:
    """The averaging namespace of `run_id`'s trainers: their DHT keys and stream protocols start with it
    (no dots in it: the keys built from it use dots as separators)."""
    return "hivenet_diloco_" + validate_run_id(run_id).replace(".", "_")


def averaging_round_key(prefix: str) -> str:
    """Where every trainer under `prefix` declares the outer step it will average for next, and
    whether it serves its state (one subkey per PeerID; read by `node.collective`)."""
    return f"{prefix}.rounds"


def round_channel_key(prefix: str, step: int) -> str:
    """What a contribution or commit for outer step `step` is signed for: it cannot be replayed in another round."""
    return f"{prefix}.round.{int(step)}"
