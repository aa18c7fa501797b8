"""`hivenet weights`: publish, fetch and inspect model weights broadcast over the swarm.

- `publish FILE --run R --version V`: sign a manifest for a safetensors file, announce it and
  serve it until Ctrl-C (peers fetch from the publisher and from each other).
- `fetch --run R [--version V] --out DIR`: download a version from every holder at once with a
  progress bar (bytes, rate, sources, ETA); `--follow` keeps fetching new versions.
- `status --run R [--json]`: versions, holders and completeness.

The shared options (run, seeds, publishers, identity, listen address, upload cap, timeout,
verbosity) are one decorator, `weights_options`, that hands each command one `WeightsOptions`.
Each command starts an unannounced `HivenetNode`, adds the `WeightBroadcast` service to it and
runs its body on the node's loop (`node.call`); Ctrl-C / SIGTERM stop the node cleanly.

Nothing heavy (torch, hivemind) is imported at module level, so `hivenet --help` stays fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from pydantic import BaseModel, ConfigDict, Field

from cli.errors import friendly_errors
from cli.options import dialable_network_option
from cli.output import echo_json, json_option, setup_logging
from node.runtime import offload
from node.shutdown import StopRequest

if TYPE_CHECKING:
    from rich.console import Console

    from node.broadcast.broadcaster import WeightBroadcast
    from node.broadcast.config import BroadcastConfig
    from node.broadcast.store import VersionEntry
    from node.config import NodeConfig
    from node.node import HivenetNode

T = TypeVar("T")

_STOP_POLL_S = 0.2
"""How often a running command checks for Ctrl-C / SIGTERM."""


class WeightsOptions(BaseModel):
    """The options every `hivenet weights` command shares: the run, how to join the swarm, logging."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    initial_peers: list[str] = Field(default_factory=list)
    publishers: list[str] = Field(default_factory=list)
    """Base58 PeerIDs authorised to publish for the run."""
    identity_path: Path | None = None
    """Key file; None for a throwaway identity."""
    host: str | None = None
    """IP to listen on; None: HIVENET_HOST or the node default (0.0.0.0)."""
    port: int | None = None
    """TCP port; None: HIVENET_PORT or the node default (any free port)."""
    upload_bytes_per_s: float | None = None
    timeout_s: float | None = None
    """How long to keep trying the seeds; None: HIVENET_BOOTSTRAP_TIMEOUT_S or the node default (30 s)."""
    dialable_networks: list[str] = Field(default_factory=list)
    """Private networks whose peers are dialed like public ones; empty: HIVENET_DIALABLE_NETWORKS or none."""
    verbose: bool = False

    def node_config(self) -> NodeConfig:
        from node.config import load_config

        return load_config(
            initial_peers=self.initial_peers or None,
            run_id=self.run_id,
            host=self.host,
            port=self.port,
            bootstrap_timeout_s=self.timeout_s,
            identity_path=self.identity_path,
            dialable_networks=self.dialable_networks or None,
        )

    def broadcast_config(
        self, store_dir: Path, publishers: list[str] | None = None, **overrides: Any
    ) -> BroadcastConfig:
        """The broadcast's config: these options, `overrides` that are set, and `publishers` if given."""
        from node.broadcast.config import BroadcastConfig
        from protocol.errors import ConfigError

        values = {key: value for key, value in overrides.items() if value is not None}
        if self.upload_bytes_per_s is not None:
            values["upload_bytes_per_s"] = self.upload_bytes_per_s
        try:
            return BroadcastConfig(
                store_dir=store_dir,
                authorized_publishers=self.publishers if publishers is None else publishers,
                **values,
            )
        except ValueError as exc:
            raise ConfigError(f"invalid weights option: {exc}") from None


_SHARED_OPTIONS = [
    click.option(
        "--run", "run_id", required=True, envvar="HIVENET_RUN_ID", help="Run id (env HIVENET_RUN_ID)."
    ),
    click.option("--initial-peers", "initial_peers", multiple=True, help="Seed multiaddr (repeatable)."),
    click.option(
        "--publisher",
        "publishers",
        multiple=True,
        help="Base58 PeerID authorised to publish for the run (repeatable; from the run's config).",
    ),
    click.option("--identity", "identity_path", type=click.Path(path_type=Path), help="Key file."),
    click.option("--host", help="IP to listen on (default 0.0.0.0)."),
    click.option("--port", type=int, help="TCP port (default 0: any free port)."),
    click.option(
        "--upload-limit",
        "upload_bytes_per_s",
        type=float,
        help="Cap this node's upload in bytes/s (application-level).",
    ),
    click.option("--timeout", "timeout_s", type=float, help="Seconds to reach seeds (default 30)."),
    dialable_network_option,
    click.option("-v", "--verbose", is_flag=True, help="Debug logging."),
]


def weights_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the shared options to a command; it receives them as one `options: WeightsOptions`."""

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        shared = {name: kwargs.pop(name) for name in WeightsOptions.model_fields}
        return func(options=WeightsOptions(**{k: v for k, v in shared.items() if v is not None}), **kwargs)

    for option in reversed(_SHARED_OPTIONS):
        command = option(command)
    return command


def _setup_logging(verbose: bool) -> None:
    setup_logging(verbose, quiet=True)
    if verbose:
        logging.getLogger("node.broadcast").setLevel(logging.INFO)


class _Stopped(Exception):
    """Ctrl-C / SIGTERM asked the command to stop (raised on the node's loop, unlike KeyboardInterrupt)."""


async def _until_stopped(work: Awaitable[T], stop: StopRequest) -> T:
    """Await `work`; if a stop is requested first, cancel it and raise _Stopped."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            if stop.requested:
                raise _Stopped
            await asyncio.wait({task}, timeout=_STOP_POLL_S)
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


@contextlib.contextmanager
def _started_node(options: WeightsOptions, stop: StopRequest, console: Console) -> Iterator[HivenetNode]:
    """An unannounced node for one command (a throwaway identity unless --identity), joined to the
    swarm; stopped on exit. Ctrl-C while the seeds are dialled raises KeyboardInterrupt."""
    from node.node import HivenetNode

    node = HivenetNode(
        options.node_config(), announce=False, ephemeral_identity=options.identity_path is None
    )
    try:
        with console.status("joining the swarm..."):
            node.start(should_stop=lambda: stop.requested)
        yield node
    finally:
        node.stop()


def _add_broadcast(node: HivenetNode, config: BroadcastConfig) -> WeightBroadcast:
    """Start the weight broadcast as a service of the started `node`."""
    from node.broadcast.broadcaster import WeightBroadcast

    assert node.dht is not None, "start the node first"
    return node.add_service(
        WeightBroadcast(
            dht=node.dht,
            identity=node.identity,
            config=config,
            metrics=node.metrics,
            attestations=node.attestations,
        )
    )


def _human(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num_bytes) < 1024 or unit == "TiB":
            return f"{num_bytes:,.1f} {unit}" if unit != "B" else f"{num_bytes:,.0f} B"
        num_bytes /= 1024
    return f"{num_bytes} B"


@click.group("weights")
def weights() -> None:
    """Publish, fetch and inspect model weights broadcast over the swarm."""


@weights.command("publish")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--version", "version", type=click.IntRange(min=0), required=True, help="Version number to publish."
)
@click.option(
    "--store",
    "store_dir",
    type=click.Path(path_type=Path),
    help="Chunk store folder (default: next to FILE).",
)
@click.option("--chunk-bytes", type=int, help="Chunk size in bytes (default 4 MiB).")
@click.option("--keep-versions", type=int, help="How many newest versions to keep on disk (default 2).")
@click.option(
    "--serve-for", "serve_for_s", type=float, help="Stop serving after this many seconds (default: Ctrl-C)."
)
@weights_options
@friendly_errors
def publish(
    file: Path,
    version: int,
    store_dir: Path | None,
    chunk_bytes: int | None,
    keep_versions: int | None,
    serve_for_s: float | None,
    options: WeightsOptions,
) -> None:
    """Publish a safetensors FILE as VERSION of a run, then serve it until Ctrl-C.

    The publisher's identity must be listed among the run's authorised publishers, or peers
    refuse the manifest. A non-safetensors torch checkpoint (.pt) is converted first.
    """
    from cli.output import make_console

    _setup_logging(options.verbose)
    console = make_console(stderr=True)
    stop = StopRequest()
    run_id = options.run_id
    with _started_node(options, stop, console) as node:
        own_id = node.identity.peer_id.to_base58()
        config = options.broadcast_config(
            store_dir or file.parent / ".hivenet-weights",
            list(dict.fromkeys([*options.publishers, own_id])),
            chunk_bytes=chunk_bytes,
            keep_versions=keep_versions,
        )
        broadcast = _add_broadcast(node, config)

        async def serve() -> None:
            if file.suffix in (".pt", ".pth", ".bin"):
                import torch

                state = await offload(torch.load, file, map_location="cpu", weights_only=True)
                manifest = await broadcast.publish(run_id, version, state)
            else:
                manifest = await broadcast.publish_file(run_id, version, file)
            console.print(
                f"[green]published[/] {run_id} v{version}: {_human(manifest.total_bytes)} in "
                f"{manifest.num_chunks} chunks, content {manifest.content_id.hex()[:16]}, publisher {own_id}"
            )
            for address in await broadcast.p2p.get_visible_maddrs():
                click.echo(f"{address}/p2p/{own_id}" if "/p2p/" not in str(address) else str(address))
            started = time.monotonic()
            with console.status("serving; Ctrl-C to stop") as line:
                while serve_for_s is None or time.monotonic() - started < serve_for_s:
                    await asyncio.sleep(1.0)
                    uploaded = broadcast.service.uploaded_bytes
                    line.update(
                        f"serving; uploaded {_human(uploaded)} ({uploaded / manifest.total_bytes:.2f}x the "
                        "checkpoint); Ctrl-C to stop"
                    )

        try:
            node.call(_until_stopped(serve(), stop))
        except (_Stopped, KeyboardInterrupt):
            console.print("stopped serving.")


def _export(entry: VersionEntry, out_dir: Path) -> Path:
    """Place the fetched safetensors file in `out_dir` (hard link when possible, else a copy)."""
    target = out_dir / f"{entry.run_id}-v{entry.version}.safetensors"
    if target.exists():
        target.unlink()
    try:
        os.link(entry.data_path, target)
    except OSError:
        shutil.copyfile(entry.data_path, target)
    return target


@weights.command("fetch")
@click.option(
    "--version", "version", type=click.IntRange(min=0), help="Version to fetch (default: the newest)."
)
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True, help="Folder."
)
@click.option(
    "--store", "store_dir", type=click.Path(path_type=Path), help="Chunk store (default: OUT/.store)."
)
@click.option("--keep-versions", type=int, help="How many newest versions to keep on disk (default 2).")
@click.option("--follow", is_flag=True, help="Keep running and fetch every new version as it is announced.")
@weights_options
@friendly_errors
def fetch(
    version: int | None,
    out_dir: Path,
    store_dir: Path | None,
    keep_versions: int | None,
    follow: bool,
    options: WeightsOptions,
) -> None:
    """Fetch a version of a run's weights from every holder at once into OUT (resumes if interrupted)."""
    if not options.publishers:  # before the heavy imports: a usage error must be instant
        raise click.UsageError("give the run's authorised publisher(s) with --publisher PEER_ID")
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from cli.output import make_console
    from node.broadcast.fetch_progress import FetchProgress

    _setup_logging(options.verbose)
    console = make_console(stderr=True)
    stop = StopRequest()
    run_id = options.run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    config = options.broadcast_config(store_dir or out_dir / ".store", keep_versions=keep_versions)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[sources]} sources"),
        TimeRemainingColumn(),
        console=console,
    )

    def reporter(description: str) -> Callable[[FetchProgress], None]:
        task = progress.add_task(description, total=None, sources=0)

        def report(snapshot: FetchProgress) -> None:
            progress.update(
                task, completed=snapshot.bytes_done, total=snapshot.total_bytes, sources=snapshot.sources
            )

        return report

    async def done(entry: VersionEntry) -> None:
        target = await offload(_export, entry, out_dir)
        console.print(f"[green]v{entry.version} complete[/] ({_human(entry.manifest.total_bytes)}): {target}")

    with _started_node(options, stop, console) as node:
        broadcast = _add_broadcast(node, config)

        async def download() -> None:
            with progress:
                if not follow:
                    entry = await broadcast.fetch(run_id, version, progress=reporter(f"{run_id}"))
                    await done(entry)
                    return
                console.print(f"following {run_id}; Ctrl-C to stop")
                broadcast.follow(run_id, on_version=done, progress=reporter(f"{run_id} (following)"))
                while True:
                    await asyncio.sleep(3600)

        try:
            node.call(_until_stopped(download(), stop))
        except (_Stopped, KeyboardInterrupt):
            console.print("stopped; chunks on disk are kept and a new fetch resumes from them.")


def _version_json(item: Any) -> dict[str, Any]:
    """One VersionStatus as plain JSON values."""
    return {
        "version": item.version,
        "content_id": item.content_id.hex(),
        "publisher": item.publisher.to_base58(),
        "total_bytes": item.total_bytes,
        "num_chunks": item.num_chunks,
        "local_chunks": item.local_chunks,
        "holders": [
            {"peer_id": h.peer_id.to_base58(), "chunks_held": h.chunks_held, "num_chunks": h.num_chunks}
            for h in item.holders
        ],
    }


@weights.command("status")
@click.option("--store", "store_dir", type=click.Path(path_type=Path), help="Local chunk store to report on.")
@json_option
@weights_options
@friendly_errors
def status(store_dir: Path | None, as_json: bool, options: WeightsOptions) -> None:
    """Show a run's versions with their holders and how complete each holder is."""
    from rich.table import Table

    from cli.output import make_console

    if not options.publishers:
        raise click.UsageError("give the run's authorised publisher(s) with --publisher PEER_ID")

    _setup_logging(options.verbose)
    console = make_console()
    stop = StopRequest()
    run_id = options.run_id
    config = options.broadcast_config(store_dir or Path(tempfile.mkdtemp(prefix="hivenet-status-")))
    with _started_node(options, stop, make_console(stderr=True)) as node:
        broadcast = _add_broadcast(node, config)
        try:
            statuses = node.call(_until_stopped(broadcast.status(run_id), stop))
        except _Stopped:
            raise KeyboardInterrupt from None
    if as_json:
        echo_json([_version_json(item) for item in statuses])
        return
    if not statuses:
        console.print(f"no versions of run {run_id!r} announced by the given publishers")
        return
    table = Table(title=f"weights of run {run_id}")
    for column in ("version", "size", "chunks", "publisher", "holders (complete/all)", "local"):
        table.add_column(column)
    for item in statuses:
        complete = sum(1 for h in item.holders if h.chunks_held == h.num_chunks)
        table.add_row(
            str(item.version),
            _human(item.total_bytes),
            str(item.num_chunks),
            item.publisher.to_base58()[-8:],
            f"{complete}/{len(item.holders)}",
            f"{item.local_chunks}/{item.num_chunks}",
        )
    console.print(table)
    for item in statuses:
        for holder in item.holders:
            share = holder.chunks_held / holder.num_chunks if holder.num_chunks else 0.0
            console.print(f"  v{item.version} {holder.peer_id.to_base58()}: {share:.0%}")
