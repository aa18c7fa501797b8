"""Command-line options that several `hivenet` commands share, defined once."""

from __future__ import annotations

import click

__all__ = ["dialable_network_option"]

dialable_network_option = click.option(
    "--dialable-network",
    "dialable_networks",
    multiple=True,
    help="A private network (e.g. 10.0.0.0/8) whose peers this node dials like public ones: a swarm "
    "on a LAN, cluster or lab (repeatable; env HIVENET_DIALABLE_NETWORKS).",
)
