"""What every command shares for its output: the global log level and machine-readable JSON.

`hivenet --log-level LEVEL CMD` (or `HIVENET_LOG_LEVEL`) sets the level for the whole
invocation, `--log-file PATH` adds a log file and `--log-format json` writes JSON lines; a command's `-v` still means debug when no level is given. `--json` commands
print exactly one JSON document on stdout (progress and logs go to stderr).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

LOG_LEVELS = ("debug", "info", "warning", "error")
_LOG_LEVEL_KEY = "hivenet.log_level"
_LOG_FILE_KEY = "hivenet.log_file"
_LOG_FORMAT_KEY = "hivenet.log_format"


def log_level_option(func: Any) -> Any:
    """The global `--log-level` option of the `hivenet` group (stored for every subcommand)."""

    def remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
        ctx.meta[_LOG_LEVEL_KEY] = value.lower() if value else None
        return value

    return click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        envvar="HIVENET_LOG_LEVEL",
        callback=remember,
        expose_value=False,
        is_eager=True,
        help="Log level of every command (env HIVENET_LOG_LEVEL; default: info, -v: debug).",
    )(func)


def log_output_options(func: Any) -> Any:
    """The global `--log-file` and `--log-format` options of the `hivenet` group."""

    def remember(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
        def store(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
            ctx.meta[key] = value
            return value

        return store

    func = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        envvar="HIVENET_LOG_FORMAT",
        callback=remember(_LOG_FORMAT_KEY),
        expose_value=False,
        is_eager=True,
        help="Log lines as text, or one JSON object per line (env HIVENET_LOG_FORMAT; default text).",
    )(func)
    return click.option(
        "--log-file",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="HIVENET_LOG_FILE",
        callback=remember(_LOG_FILE_KEY),
        expose_value=False,
        is_eager=True,
        help="Also append every log line to this file (env HIVENET_LOG_FILE; logrotate-safe).",
    )(func)


def chosen_log_level() -> str | None:
    """The level given with --log-level / HIVENET_LOG_LEVEL, if any."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_LOG_LEVEL_KEY)


def setup_logging(verbose: bool = False, *, quiet: bool = False) -> None:
    """Configure logging for a command: the global level if one was chosen, else -v / the command's default."""
    from node.logs import configure_logging

    level = chosen_log_level()
    ctx = click.get_current_context(silent=True)
    meta = {} if ctx is None else ctx.meta
    configure_logging(
        verbose or level == "debug",
        quiet=quiet,
        log_file=meta.get(_LOG_FILE_KEY),
        log_format=meta.get(_LOG_FORMAT_KEY) or "text",
    )
    if level is not None:
        logging.getLogger().setLevel(level.upper())


def json_option(func: Any) -> Any:
    """A command's `--json` flag (received as `as_json`)."""
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")(
        func
    )


def echo_json(data: Any) -> None:
    """Print `data` as one JSON document on stdout."""
    click.echo(json.dumps(data, indent=2, default=str))


OFF_TERMINAL_WIDTH = 1000
"""Columns a command's output may use off a terminal: lines are never wrapped there."""


def make_console(*, stderr: bool = False) -> Any:
    """A rich `Console` for a command's output: on a terminal it fits the terminal, off one (a pipe, a
    file, a journal) it never wraps, so that a PeerID or multiaddr stays on one line for grep and copy."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=OFF_TERMINAL_WIDTH, soft_wrap=True)


def plain_printer(console: Any) -> Callable[[str], None]:
    """A function that prints a line on `console` as it is: no markup, no highlighting.

    For lines that quote what peers sent (verdict reasons, names, versions): read as rich markup,
    a reason such as `[/x]` raises in the printing thread and would stop the role reporting it.
    """

    def print_plain(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    return print_plain
