"""Verification policy files: the JSON `hivenet calibrate` writes and `--verification-policy FILE` reads."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from protocol.errors import ConfigError
from protocol.verification_policy import RunVerification

__all__ = ["load_policy_file", "save_policy_file"]


def save_policy_file(policy: RunVerification, path: Path | str) -> Path:
    """Write `policy` as JSON at `path` (atomically, parents created) and return the path."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(policy.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return path


def load_policy_file(path: Path | str) -> RunVerification:
    """Read a policy file; ConfigError, saying what to do, if it is missing or not a policy."""
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read verification policy {path}: {exc.strerror or exc}") from None
    try:
        return RunVerification.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors(include_url=False)[:3]
        )
        raise ConfigError(
            f"{path} is not a verification policy ({problems}); write one with `hivenet calibrate`"
        ) from None
