"""What a round gives its member: the aggregate of the agreed contributions, and who is in it.

`tally_round` runs on a worker thread once a member knows the round's final set
(`RoundBook.final_set`): it decodes every contribution of the set (ascending PeerID), leaves out
those that do not decode (every member decodes the same bytes, so every member leaves out the
same ones), aggregates the rest (`node.collective.aggregate`, whose norm cap may refuse more),
and says whether this member's state is the set's majority state. The caller bans the senders
of undecodable contributions and gives standing to the members that held the majority state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from node.collective.aggregate import aggregate_contributions
from node.collective.book import RoundBook
from node.collective.codecs import PseudoGradCodec
from node.collective.round_types import RoundOutcome
from node.collective.rules import AggregationRule
from protocol.errors import InvalidMessage

__all__ = ["Tally", "tally_round"]


@dataclass
class Tally:
    outcome: RoundOutcome
    in_majority: list[bytes] = field(default_factory=list)
    """Members whose contribution is in the average and who held the round's majority state."""
    undecodable: dict[bytes, str] = field(default_factory=dict)
    """Members whose contribution did not decode, and why."""


def tally_round(
    book: RoundBook,
    final: dict[bytes, bytes],
    *,
    me: bytes,
    round_key: str,
    outer_hash: str,
    codec: PseudoGradCodec,
    rule: AggregationRule,
    max_norm_ratio: float | None,
    min_norm: float = 0.0,
) -> Tally:
    """The outcome of a round whose agreed contributions are `final` ({peer: payload hash})."""
    members = sorted(final)
    decoded, undecodable = {}, {}
    for peer in members:
        try:
            decoded[peer] = codec.decode(book.contributions[peer].payload)
        except InvalidMessage as exc:
            undecodable[peer] = str(exc)
    kept = [p for p in members if p in decoded]
    if not kept:
        return Tally(RoundOutcome(None, 1, refused_peers=len(undecodable)), undecodable=undecodable)
    aggregate = aggregate_contributions(
        [decoded[p] for p in kept], rule=rule, max_norm_ratio=max_norm_ratio, min_norm=min_norm
    )
    refused = set(undecodable) | {kept[i] for i in aggregate.refused}
    kept = [p for p in kept if p not in refused]
    hashes = [book.contributions[p].header.outer_hash for p in members]
    majority = max(sorted(set(hashes)), key=hashes.count)
    round_id = hashlib.sha256(round_key.encode() + b"".join(p + final[p] for p in members)).digest()[:20]
    outcome = RoundOutcome(
        averaged=aggregate.tensors,
        num_peers=len(kept),
        in_sync=outer_hash == majority,
        refused_peers=len(refused),
        round_id=round_id,
        received_bytes={p: len(book.contributions[p].payload) for p in kept if p != me},
    )
    in_majority = [p for p in kept if book.contributions[p].header.outer_hash == majority]
    return Tally(outcome, in_majority, undecodable)
