"""Text that peers send and nodes print: what shapes it may take, and how it is made printable.

Reasons, names and versions arrive from strangers and end up in terminals, logs and the dashboard.
A record or message whose text breaks these rules is refused where it is parsed (`InvalidMessage`,
or a pydantic validation error); text this node sends is made printable before it is signed.
"""

from __future__ import annotations

import re

__all__ = ["NAME_PATTERN", "REASON_PATTERN", "VERSION_PATTERN", "name_text", "printable_text"]

NAME_PATTERN = re.compile(r"^[\w .,:@()+-]*$")
"""A name a person or a driver gave (a node's public name, an accelerator's model): letters, digits,
spaces and a little punctuation, none of which a terminal, rich markup or HTML reads as a command."""

REASON_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
"""A machine-readable reason (`toploc_exponent`, `banned`): a snake_case word."""

VERSION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$")
"""A software version as PEP 440 and semantic versioning write them (`0.1.0`, `1.2.0rc1+g1a2b`)."""


def name_text(text: str) -> str:
    """`text` with every character a name may not hold (`NAME_PATTERN`) replaced by a space."""
    return re.sub(r"[^\w .,:@()+-]", " ", text)


def printable_text(text: str) -> str:
    """`text` with every character that would not print as itself (controls, escapes, line breaks)
    replaced by `?`."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else "?" for c in text)
