"""Turning hivenet errors into clean one-paragraph CLI failures instead of tracebacks."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from protocol.errors import HivenetError

F = TypeVar("F", bound=Callable[..., Any])


def friendly_errors(func: F) -> F:
    """Report HivenetError as a red message and exit code 1; Ctrl-C exits with 130."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except HivenetError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            raise SystemExit(1) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            raise SystemExit(130) from None

    return wrapper  # type: ignore[return-value]
