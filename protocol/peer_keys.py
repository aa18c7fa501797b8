"""Ed25519 keys in libp2p form: PeerIDs that inline the public key, and back.

A PeerID built from an Ed25519 key is an identity multihash of the protobuf-encoded
public key, so anyone can verify a signature from the PeerID alone, with no lookup
(`signature_verifies`). Keys are made and messages signed with `cryptography`; signatures are
checked with libsodium (PyNaCl), whose Ed25519 verify runs at about twice OpenSSL's rate and
refuses non-canonical signatures and small-order public keys (strict RFC 8032): receiving
nodes verify far more signatures (DHT records, envelopes, every receipt a ledger takes in) than
they make.
"""

from __future__ import annotations

import functools

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from hivemind.proto import crypto_pb2
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from protocol.errors import InvalidMessage

_IDENTITY_MULTIHASH = 0x00
_ED25519_PUBLIC_KEY_BYTES = 32
_ED25519_SIGNATURE_BYTES = 64


def public_key_bytes(public_key: Ed25519PublicKey) -> bytes:
    """The raw 32-byte Ed25519 public key."""
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def peer_id_from_public_key(public_key: Ed25519PublicKey) -> bytes:
    """The libp2p PeerID (as bytes) of an Ed25519 public key."""
    encoded = crypto_pb2.PublicKey(
        key_type=crypto_pb2.KeyType.Ed25519, data=public_key_bytes(public_key)
    ).SerializeToString()
    return bytes([_IDENTITY_MULTIHASH, len(encoded)]) + encoded


def peer_id_from_private_key(private_key: Ed25519PrivateKey) -> bytes:
    """The libp2p PeerID (as bytes) of the node that owns `private_key`."""
    return peer_id_from_public_key(private_key.public_key())


class Signer:
    """A private key made ready for signing many messages: libsodium's signing key and the PeerID,
    derived once. Ed25519 signatures are deterministic, so they are the very bytes
    `Ed25519PrivateKey.sign` makes, at about 1.6x its rate."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = SigningKey(private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))
        self.peer_id = peer_id_from_private_key(private_key)
        """The signer's PeerID (bytes)."""

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of `message`."""
        return bytes(self._key.sign(message).signature)


def check_ed25519_peer_id(peer_id: bytes) -> bytes:
    """`peer_id` itself if it is an Ed25519 PeerID (a peer that can sign); InvalidMessage otherwise."""
    _raw_public_key(_checked(peer_id))
    return peer_id


def signature_verifies(peer_id: bytes, signature: bytes, message: bytes) -> bool:
    """Whether `signature` is a valid Ed25519 signature of `message` by the key inlined in `peer_id`.

    Raises InvalidMessage if `peer_id` is not an Ed25519 PeerID; any malformed signature is just
    invalid.
    """
    key = _verify_key(_checked(peer_id))
    if not isinstance(signature, bytes) or len(signature) != _ED25519_SIGNATURE_BYTES:
        return False
    try:
        key.verify(message, signature)
    except BadSignatureError:
        return False
    return True


def _checked(peer_id: object) -> bytes:
    if not isinstance(peer_id, bytes):
        raise InvalidMessage(f"peer id must be bytes, got {type(peer_id).__name__}")
    return peer_id


# Cached (bounded; a failure is not cached): ledgers and record validators check signatures of the
# same few thousand peers over and over, and decoding the key costs a sixth of a verify. Sized for
# that, not for a flood of fresh identities, which would only fill memory with keys never seen again.
@functools.lru_cache(maxsize=8192)
def _verify_key(peer_id: bytes) -> VerifyKey:
    return VerifyKey(_raw_public_key(peer_id))


@functools.lru_cache(maxsize=8192)
def _raw_public_key(peer_id: bytes) -> bytes:
    if len(peer_id) < 2 or peer_id[0] != _IDENTITY_MULTIHASH or peer_id[1] != len(peer_id) - 2:
        raise InvalidMessage("peer id does not inline its public key (only Ed25519 peer ids are accepted)")
    encoded = crypto_pb2.PublicKey()
    try:
        encoded.ParseFromString(peer_id[2:])
    except Exception as exc:  # protobuf raises DecodeError and, for some inputs, other errors
        raise InvalidMessage(f"peer id holds a malformed public key: {exc}") from None
    if encoded.key_type != crypto_pb2.KeyType.Ed25519 or len(encoded.data) != _ED25519_PUBLIC_KEY_BYTES:
        raise InvalidMessage("peer id is not an Ed25519 key; hivenet signs with Ed25519 only")
    return bytes(encoded.data)
