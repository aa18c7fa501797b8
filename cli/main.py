"""The `hivenet` command: a click group whose subcommands live in sibling modules.

Nothing heavy (torch, hivemind) is imported at module level, so `hivenet --help` stays fast.
"""

from __future__ import annotations

import click

from cli.calibrate import calibrate
from cli.dashboard import dashboard
from cli.examples import add_examples
from cli.ledger import ledger
from cli.model import model
from cli.node_commands import identity, join, seed, simulate
from cli.output import log_level_option, log_output_options
from cli.swarm_queries import doctor, peers
from cli.weights import weights


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hivenet")
@log_level_option
@log_output_options
def cli() -> None:
    """hivenet: an open peer-to-peer network for training AI models together.

    Start with `hivenet simulate` to watch a swarm on this machine, or
    `hivenet join --initial-peers ADDR` to contribute to a real one.

    Every setting can also come from an environment variable named after it
    (HIVENET_RUN_ID, HIVENET_INITIAL_PEERS, HIVENET_STATUS_PORT, HIVENET_TRAINER_INNER_STEPS, ...)
    or from the --config TOML file; a flag wins over the variable, which wins over the file.
    """


for command in (identity, join, seed, peers, doctor, simulate, weights, ledger, dashboard, model, calibrate):
    cli.add_command(command)
add_examples(cli)


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
