"""Node configuration: one pydantic model, built from defaults, a TOML file, `HIVENET_*`
environment variables and CLI flags.

Precedence is flag over environment variable over config file over default. Every setting
has an environment variable named after it (`run_id`: `HIVENET_RUN_ID`, `initial_peers`:
`HIVENET_INITIAL_PEERS`, a JSON list or comma-separated); unknown keys in the file are an
error. The file's `[trainer]` table belongs to the trainer options (`cli.train`), which read
it with `config_table`. Runtime objects (the DHT, models) never live here: they are passed to
components as arguments.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import platformdirs
from multiaddr import Multiaddr
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource

from node.dialable import parse_networks
from protocol.dht_keys import validate_run_id
from protocol.errors import ConfigError
from protocol.limits import MAX_NODE_RECORD_TTL_S, MAX_PUBLIC_NAME_CHARS
from protocol.node_record import Role

INITIAL_PEER_EXAMPLE = "/ip4/203.0.113.5/tcp/31337/p2p/12D3KooWExamplePeerId..."
ENV_PREFIX = "HIVENET_"
"""Prefix of the environment variables that configure a node (`HIVENET_RUN_ID`, ...)."""
DEVICE_NAME_PATTERN = r"^(cpu|mps|cuda(:[0-9]+)?)$"
"""The device names a node accepts (`training.devices.resolve_device` checks the device is there)."""
TRAINER_TABLE = "trainer"
"""The config file's table of trainer options (read by the trainer, not by NodeConfig)."""


def default_identity_path() -> Path:
    """Where a node keeps its key unless told otherwise."""
    return Path(platformdirs.user_data_dir("hivenet")) / "identity.key"


def node_state_dir(identity_path: Path) -> Path:
    """The directory of a node's own state (weights, ledgers, counters), beside its key file and named
    after it: two processes never run with one key (it is locked), so they never share state by default."""
    return identity_path.with_name(f"{identity_path.stem}-state")


def default_ledger_path(identity_path: Path, run_id: str) -> Path:
    """Where `hivenet join` keeps a run's receipts ledger unless told otherwise."""
    return node_state_dir(identity_path) / "ledgers" / f"{run_id}.db"


def parse_initial_peer(text: str) -> str:
    """Check that `text` is a dialable multiaddr ending in /p2p/<PeerID>; raise ConfigError with the expected form."""
    try:
        address = Multiaddr(text)
        protocols = [proto.name for proto in address.protocols()]
    except Exception as exc:
        raise ConfigError(
            f"invalid initial peer {text!r} ({exc}); expected a full multiaddr such as {INITIAL_PEER_EXAMPLE} "
            "(a seed node prints it at start-up)"
        ) from None
    if "p2p" not in protocols or not ({"ip4", "ip6", "dns", "dns4", "dns6"} & set(protocols)):
        raise ConfigError(
            f"invalid initial peer {text!r}: it must name a host and end with /p2p/<PeerID>, "
            f"e.g. {INITIAL_PEER_EXAMPLE}"
        )
    return str(address)


def check_base58_peer_ids(value: list[str]) -> list[str]:
    """`value` unchanged if every item is a base58 PeerID, else ValueError (a pydantic field validator's body)."""
    from hivemind.p2p import PeerID  # here, so that configuration modules load without the p2p stack

    for text in value:
        try:
            PeerID.from_base58(text)
        except Exception:
            raise ValueError(f"{text!r} is not a base58 PeerID") from None
    return value


class NodeConfig(BaseModel):
    """Everything a node needs to join a swarm."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    identity_path: Path = Field(default_factory=default_identity_path)
    """Ed25519 key file (created on first start, mode 0600)."""
    weights_dir: Path = Field(default_factory=lambda data: node_state_dir(data["identity_path"]) / "weights")
    """Chunk store of the weight broadcast: the versions this node publishes (a trainer) or holds
    (and a worker's next assignment counter); by default in the node's own state directory."""
    initial_peers: list[str] = Field(default_factory=list)
    """Multiaddrs of seed nodes (or any live node) to bootstrap from."""
    roles: list[Role] = Field(default_factory=lambda: [Role.VALIDATOR], min_length=1)
    """What this node does in the swarm. The default is a validator on an RL run only: on another
    run `hivenet join` makes it a relay, and refuses a validator given here (`cli.rl.non_rl_node_roles`)."""
    public_name: str = Field(default="", max_length=MAX_PUBLIC_NAME_CHARS)
    """Name shown to others; defaults to the short PeerID."""
    run_id: str = "default"
    """The training run to take part in."""
    host: str = "0.0.0.0"
    """IP address to listen on (127.0.0.1 for a local swarm)."""
    port: int = Field(default=0, ge=0, le=65535)
    """TCP port to listen on; 0 picks a free one (seeds use a fixed port)."""
    announce_addresses: list[str] = Field(default_factory=list)
    """Multiaddrs to announce instead of the listening ones, e.g. for a public IP behind port forwarding."""
    record_ttl_s: float = Field(default=60.0, gt=0, le=MAX_NODE_RECORD_TTL_S)
    """How long a published node record stays valid without a refresh."""
    refresh_interval_s: float = Field(default=20.0, gt=0)
    """How often the node record is re-published; well under record_ttl_s."""
    bootstrap_timeout_s: float = Field(default=30.0, gt=0)
    """How long to keep retrying unreachable initial peers before reporting them."""
    use_auto_relay: bool = False
    """Look for relays to become reachable when this node is behind NAT."""
    dialable_networks: list[str] = Field(default_factory=list)
    """Private networks (`10.0.0.0/8`) whose addresses this node dials like public ones: a swarm on a
    LAN, a cluster or a lab. A seed dials back requesters there too. Default: public addresses only."""
    status_file: Path | None = None
    """If set, a JSON status snapshot is written here every refresh (machine-readable health)."""
    status_port: int | None = Field(default=None, ge=0, le=65535)
    """If set, serve the status snapshot as JSON over HTTP on 127.0.0.1 at this port (and /metrics)."""
    metrics_host: str = "127.0.0.1"
    """Address the status port listens on. Another than loopback (0.0.0.0, a LAN address) lets a
    Prometheus server elsewhere scrape /metrics; /status and /health still answer local clients only."""
    trusted_signers: list[str] = Field(default_factory=list)
    """Base58 PeerIDs the run names as signers of receipts (its trainers and validators; `hivenet
    join` sets them from --publisher, --trusted-validator and --admitted-trainer): the receipts this
    node pulls from peers are kept in full only for them and the peers they credited
    (`node.receipts.standing`)."""
    ledger_path: Path | None = None
    """If set, the node keeps its receipts in this ledger (SQLite), serves it to peers and pulls theirs
    into it (`node.receipts`); `hivenet join` sets it (`default_ledger_path`, in the node's own state
    directory) unless given."""
    device: str = "cpu"
    """Where this node's roles run their models: cpu, cuda, cuda:N or mps (checked when they start)."""
    reachability_check: Literal["auto", "on", "off"] = "auto"
    """Whether `hivenet join` asks its seeds to dial it back once it has joined, and prints whether peers
    can reach it (the seed that did earns a receipt); auto: unless every initial peer is on loopback,
    where a dial-back proves nothing."""

    @field_validator("initial_peers")
    @classmethod
    def _check_initial_peers(cls, value: list[str]) -> list[str]:
        return [parse_initial_peer(item) for item in value]

    @field_validator("announce_addresses")
    @classmethod
    def _check_announce(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                Multiaddr(item)
            except Exception as exc:
                raise ValueError(
                    f"invalid announce address {item!r}: {exc}; e.g. /ip4/203.0.113.5/tcp/31337"
                ) from None
        return value

    @field_validator("dialable_networks")
    @classmethod
    def _check_dialable_networks(cls, value: list[str]) -> list[str]:
        return [str(network) for network in parse_networks(value)]

    @field_validator("trusted_signers")
    @classmethod
    def _check_trusted_signers(cls, value: list[str]) -> list[str]:
        return check_base58_peer_ids(value)

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if not re.fullmatch(DEVICE_NAME_PATTERN, value):
            raise ValueError(f"unknown device {value!r}: use cpu, cuda, cuda:N (N: the GPU's number) or mps")
        return value

    @field_validator("run_id")
    @classmethod
    def _check_run_id(cls, value: str) -> str:
        return validate_run_id(value)

    @model_validator(mode="after")
    def _check_refresh(self) -> NodeConfig:
        if self.refresh_interval_s >= self.record_ttl_s:
            raise ValueError(
                f"refresh_interval_s ({self.refresh_interval_s}) must be shorter than record_ttl_s "
                f"({self.record_ttl_s}), or records expire between refreshes"
            )
        return self

    @property
    def host_maddrs(self) -> list[str]:
        kind = "ip6" if ":" in self.host else "ip4"
        return [f"/{kind}/{self.host}/tcp/{self.port}"]


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source; a list may also be given comma-separated."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        if isinstance(value, str) and not value.lstrip().startswith(("[", "{")):
            return [item.strip() for item in value.split(",") if item.strip()]
        return super().decode_complex_value(field_name, field, value)


def env_settings(model: type[BaseModel], prefix: str = ENV_PREFIX) -> dict[str, Any]:
    """The fields of `model` set by environment variables `<prefix><FIELD NAME>` (any case)."""
    try:
        return dict(_EnvSource(model, env_prefix=prefix, case_sensitive=False, env_ignore_empty=True)())  # type: ignore[arg-type]
    except Exception as exc:  # pydantic-settings' SettingsError: a list that is not valid JSON
        raise ConfigError(f"invalid {prefix}* environment variable: {exc}") from None


def read_config_file(config_file: Path) -> dict[str, Any]:
    """The whole TOML config file as a dict; ConfigError if it is missing or malformed."""
    try:
        return tomllib.loads(config_file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {config_file} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from None


def config_table(config_file: Path | None, table: str) -> dict[str, Any]:
    """The `[table]` of the config file ({} without a file or without that table)."""
    if config_file is None:
        return {}
    values = read_config_file(config_file).get(table, {})
    if not isinstance(values, dict):
        raise ConfigError(f"config file {config_file}: {table!r} must be a table ([{table}])")
    return values


def explain_validation_error(
    exc: ValidationError, model: type[BaseModel], what: str, sources: str
) -> ConfigError:
    """One ConfigError listing every problem of `exc`, with the known settings for an unknown key."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "config"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown setting (known: {', '.join(sorted(model.model_fields))})"
        problems.append(f"{where}: {message}")
    return ConfigError(f"invalid {what} (from {sources}):\n  " + "\n  ".join(problems))


def load_config(config_file: Path | None = None, **flags: Any) -> NodeConfig:
    """Build a NodeConfig: defaults, then `config_file` (TOML, less its [trainer] table), then
    `HIVENET_*` environment variables, then `flags` whose value is not None."""
    values: dict[str, Any] = {}
    if config_file is not None:
        values.update(read_config_file(config_file))
        values.pop(TRAINER_TABLE, None)
    values.update(env_settings(NodeConfig))
    values.update({key: value for key, value in flags.items() if value is not None})
    try:
        return NodeConfig(**values)
    except ConfigError:
        raise
    except ValidationError as exc:
        sources = (
            f"{config_file}, {ENV_PREFIX}* variables and flags"
            if config_file
            else f"{ENV_PREFIX}* variables and flags"
        )
        raise explain_validation_error(exc, NodeConfig, "configuration", sources) from None
