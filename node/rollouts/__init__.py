"""The rollout transport: workers ask validators for tickets and submit sealed groups to them,
validators forward verified groups to trainers. Bytes and protocol messages only; issuing tickets
and judging are injected handlers."""

from node.rollouts.client import Receipt, submit_group, submit_group_receipts
from node.rollouts.config import ForwardConfig, IntakeConfig
from node.rollouts.errors import (
    GroupRefused,
    PeerUnavailable,
    RolloutTransportError,
    SubmissionRefused,
    SubmissionTimeout,
    TicketsRefused,
)
from node.rollouts.forward import PROTO_FORWARD, ForwardHandler, ForwardIntake, forward_group
from node.rollouts.intake import PROTO_SUBMIT, GroupHandler, RolloutIntake
from node.rollouts.peers import connect_member, replicate_p2p
from node.rollouts.tickets import PROTO_TICKETS, TicketHandler, TicketIntake, request_tickets

__all__ = [
    "PROTO_FORWARD",
    "PROTO_SUBMIT",
    "PROTO_TICKETS",
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
    "TicketHandler",
    "TicketIntake",
    "TicketsRefused",
    "connect_member",
    "forward_group",
    "replicate_p2p",
    "request_tickets",
    "submit_group",
    "submit_group_receipts",
]
