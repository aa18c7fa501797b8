"""The rollout transport: workers submit sealed groups to validators, validators forward verified
groups to trainers. Bytes and protocol messages only; the judgement is an injected handler."""

from node.rollouts.client import Receipt, submit_group, submit_group_receipts
from node.rollouts.config import ForwardConfig, IntakeConfig
from node.rollouts.errors import (
    GroupRefused,
    PeerUnavailable,
    RolloutTransportError,
    SubmissionRefused,
    SubmissionTimeout,
)
from node.rollouts.forward import PROTO_FORWARD, ForwardHandler, ForwardIntake, forward_group
from node.rollouts.intake import PROTO_SUBMIT, GroupHandler, RolloutIntake
from node.rollouts.peers import connect_member, replicate_p2p

__all__ = [
    "PROTO_FORWARD",
    "PROTO_SUBMIT",
    "ForwardConfig",
    "ForwardHandler",
    "ForwardIntake",
    "GroupHandler",
    "GroupRefused",
    "IntakeConfig",
    "PeerUnavailable",
    "Receipt",
    "RolloutIntake",
    "RolloutTransportError",
    "SubmissionRefused",
    "SubmissionTimeout",
    "connect_member",
    "forward_group",
    "replicate_p2p",
    "submit_group",
    "submit_group_receipts",
]
