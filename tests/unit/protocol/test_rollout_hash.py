"""A rollout has one name whatever its encoding: unknown fields, field order, packing, repeats and proofs
change nothing, so a re-encoded group is a replay and earns no second credit."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import rollouts_pb2 as rpb
from protocol.rollout_messages import rollout_hash


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def _length_delimited(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


def _fields(r: rpb.Rollout, *, packed: bool) -> list[bytes]:
    """One encoded field per entry, each way the wire format allows for `r`'s values."""
    out = []
    for number, ids in ((1, r.prompt_ids), (2, r.completion_ids)):
        if packed:
            out.append(_length_delimited(number, b"".join(_varint(i) for i in ids)))
        else:
            out.extend(_field(number, 0, _varint(i)) for i in ids)
    out.append(_length_delimited(3, r.dtype.encode()))
    out.append(_field(4, 5, struct.pack("<f", r.temperature)))
    out.append(_field(5, 5, struct.pack("<f", r.top_p)))
    out.append(_field(6, 0, _varint(r.seed)))
    out.extend(_length_delimited(7, proof) for proof in r.proofs)
    out.append(_length_delimited(8, r.device.encode()))
    return out


rollouts = st.builds(
    rpb.Rollout,
    prompt_ids=st.lists(st.integers(0, 70_000), min_size=1, max_size=12),
    completion_ids=st.lists(st.integers(0, 70_000), min_size=1, max_size=40),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    temperature=st.sampled_from([1.0, 0.5]),
    top_p=st.sampled_from([1.0, 0.75]),
    seed=st.integers(0, 2**64 - 1),
    proofs=st.lists(st.binary(min_size=2, max_size=8), max_size=3),
    device=st.sampled_from(["cpu", "cuda"]),
)
unknown = st.lists(
    st.one_of(
        st.builds(lambda n, v: _field(n, 0, _varint(v)), st.integers(9, 500), st.integers(0, 2**40)),
        st.builds(lambda n, b: _length_delimited(n, b), st.integers(9, 500), st.binary(max_size=16)),
        st.builds(lambda n, b: _field(n, 5, b), st.integers(9, 500), st.binary(min_size=4, max_size=4)),
    ),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(rollouts, st.booleans(), st.booleans(), unknown, st.binary(max_size=6))
def test_every_encoding_of_a_rollout_has_its_one_name(
    rollout: rpb.Rollout, packed: bool, reverse: bool, extra: list[bytes], other_proof: bytes
) -> None:
    canonical = rollout_hash(rollout.SerializeToString())
    fields = _fields(rollout, packed=packed or reverse)
    if reverse:
        fields.reverse()  # distinct fields in another order; repeated values stay in order in one packed field
    stale_seed = _field(6, 0, _varint((rollout.seed + 1) % 2**64))  # a scalar given twice: the last wins
    encoded = stale_seed + b"".join(fields) + b"".join(extra)
    assert rpb.Rollout.FromString(encoded).completion_ids == rollout.completion_ids
    assert rollout_hash(encoded) == canonical
    reproved = rpb.Rollout()
    reproved.CopyFrom(rollout)
    reproved.proofs.append(other_proof)  # other proofs of the same tokens: the same rollout
    assert rollout_hash(reproved.SerializeToString()) == canonical


@settings(max_examples=50, deadline=None)
@given(rollouts, st.integers(0, 39))
def test_other_tokens_are_another_rollout(rollout: rpb.Rollout, at: int) -> None:
    changed = rpb.Rollout()
    changed.CopyFrom(rollout)
    at %= len(changed.completion_ids)
    changed.completion_ids[at] = (changed.completion_ids[at] + 1) % 70_001
    assert rollout_hash(changed.SerializeToString()) != rollout_hash(rollout.SerializeToString())


def test_bytes_that_do_not_decode_are_named_by_their_own_hash() -> None:
    assert rollout_hash(b"\xff\xff") != rollout_hash(b"\xff\xfe")
    assert rollout_hash(b"\xff\xff") != rollout_hash(rpb.Rollout().SerializeToString())
