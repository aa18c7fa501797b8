"""`hivenet weights`: publish, fetch and inspect model weights broadcast over the swarm.

- `publish FILE --run R --version V`: sign a manifest for a safetensors file, announce it and
  serve it until Ctrl-C (peers fetch from the publisher and from each other).
- `fetch --run R [--version V] --out DIR`: download a version from every holder at once with a
  progress bar (bytes, rate, sources, ETA); `--follow` keeps fetching new versions.
- `status --run R`: versions, holders and completeness.

Nothing heavy (torch, hivemind) is imported at module level, so `hivenet --help` stays fast.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.errors import friendly_errors

if TYPE_CHECKING:
    from node.broadcast.broadcaster import WeightBroadcast
    from node.broadcast.config import BroadcastConfig
    from node.broadcast.store import VersionEntry


def _network_options(func: Any) -> Any:
    options = [
        click.option("--run", "run_id", required=True, help="Run id."),
        click.option("--initial-peers", "initial_peers", multiple=True, help="Seed multiaddr (repeatable)."),
        click.option(
            "--publisher",
            "publishers",
            multiple=True,
            help="Base58 PeerID authorised to publish for the run (repeatable; from the run's config).",
        ),
        click.option("--identity", "identity_path", type=click.Path(path_type=Path), help="Key file."),
        click.option("--host", default="0.0.0.0", show_default=True, help="IP to listen on."),
        click.option("--port", type=int, default=0, show_default=True, help="TCP port (0: any free port)."),
        click.option(
            "--upload-limit",
            "upload_bytes_per_s",
            type=float,
            help="Cap this node's upload in bytes/s (application-level).",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            type=float,
            default=30.0,
            show_default=True,
            help="Seconds to reach seeds.",
        ),
        click.option("-v", "--verbose", is_flag=True, help="Debug logging."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _setup_logging(verbose: bool) -> None:
    from node.logs import configure_logging

    configure_logging(verbose, quiet=True)
    if verbose:
        logging.getLogger("node.broadcast").setLevel(logging.INFO)


def _start_dht(
    *,
    identity_path: Path | None,
    initial_peers: tuple[str, ...],
    run_id: str,
    host: str,
    port: int,
    timeout_s: float,
) -> tuple[Any, Any]:
    """Start a DHT (own p2pd) and bootstrap it; a temporary identity when none is given."""
    from node.config import load_config
    from node.dht_node import bootstrap, start_dht, start_ephemeral_dht
    from node.identity import load_or_create_identity

    config = load_config(
        initial_peers=list(initial_peers),
        run_id=run_id,
        host=host,
        port=port,
        bootstrap_timeout_s=timeout_s,
    )
    if identity_path is None:
        dht, identity = start_ephemeral_dht(config, client_mode=False)
    else:
        identity = load_or_create_identity(identity_path)
        dht = start_dht(config.model_copy(update={"identity_path": identity_path}), identity)
    try:
        if config.initial_peers:
            bootstrap(dht, config.initial_peers, timeout_s)
    except BaseException:
        dht.shutdown()
        raise
    return dht, identity


def _broadcast_config(store_dir: Path, publishers: list[str], **overrides: Any) -> BroadcastConfig:
    from node.broadcast.config import BroadcastConfig
    from protocol.errors import ConfigError

    values = {key: value for key, value in overrides.items() if value is not None}
    try:
        return BroadcastConfig(store_dir=store_dir, authorized_publishers=publishers, **values)
    except ValueError as exc:
        raise ConfigError(f"invalid weights option: {exc}") from None


async def _with_broadcast(
    dht: Any, identity: Any, config: BroadcastConfig, body: Callable[[WeightBroadcast], Any]
) -> Any:
    from node.broadcast.broadcaster import WeightBroadcast

    broadcast = WeightBroadcast(dht=dht, identity=identity, config=config)
    await broadcast.start()
    try:
        return await body(broadcast)
    finally:
        await broadcast.stop()


def _human(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num_bytes) < 1024 or unit == "TiB":
            return f"{num_bytes:,.1f} {unit}" if unit != "B" else f"{num_bytes:,.0f} B"
        num_bytes /= 1024
    return f"{num_bytes} B"


def _sigterm_as_interrupt() -> None:
    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


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
@_network_options
@friendly_errors
def publish(
    file: Path,
    version: int,
    store_dir: Path | None,
    chunk_bytes: int | None,
    keep_versions: int | None,
    serve_for_s: float | None,
    run_id: str,
    initial_peers: tuple[str, ...],
    publishers: tuple[str, ...],
    identity_path: Path | None,
    host: str,
    port: int,
    upload_bytes_per_s: float | None,
    timeout_s: float,
    verbose: bool,
) -> None:
    """Publish a safetensors FILE as VERSION of a run, then serve it until Ctrl-C.

    The publisher's identity must be listed among the run's authorised publishers, or peers
    refuse the manifest. A non-safetensors torch checkpoint (.pt) is converted first.
    """
    from rich.console import Console

    _setup_logging(verbose)
    console = Console(stderr=True)
    _sigterm_as_interrupt()
    with console.status("joining the swarm..."):
        dht, identity = _start_dht(
            identity_path=identity_path,
            initial_peers=initial_peers,
            run_id=run_id,
            host=host,
            port=port,
            timeout_s=timeout_s,
        )
    own_id = identity.peer_id.to_base58()
    config = _broadcast_config(
        store_dir or file.parent / ".hivenet-weights",
        list(dict.fromkeys([*publishers, own_id])),
        chunk_bytes=chunk_bytes,
        keep_versions=keep_versions,
        upload_bytes_per_s=upload_bytes_per_s,
    )

    async def body(broadcast: WeightBroadcast) -> None:
        path = file
        if file.suffix in (".pt", ".pth", ".bin"):
            import torch

            state = torch.load(file, map_location="cpu", weights_only=True)
            manifest = await broadcast.publish(run_id, version, state)
        else:
            manifest = await broadcast.publish_file(run_id, version, path)
        console.print(
            f"[green]published[/] {run_id} v{version}: {_human(manifest.total_bytes)} in {manifest.num_chunks} "
            f"chunks, manifest {manifest.sha256.hex()[:16]}, publisher {own_id}"
        )
        for address in await broadcast.p2p.get_visible_maddrs():
            click.echo(f"{address}/p2p/{own_id}" if "/p2p/" not in str(address) else str(address))
        started = time.monotonic()
        with console.status("serving; Ctrl-C to stop") as line:
            while serve_for_s is None or time.monotonic() - started < serve_for_s:
                await asyncio.sleep(1.0)
                uploaded = broadcast.service.uploaded_bytes
                line.update(
                    f"serving; uploaded {_human(uploaded)} ({uploaded / manifest.total_bytes:.2f}x the checkpoint); "
                    "Ctrl-C to stop"
                )

    try:
        asyncio.run(_with_broadcast(dht, identity, config, body))
    except KeyboardInterrupt:
        console.print("stopped serving.")
    finally:
        dht.shutdown()


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
@_network_options
@friendly_errors
def fetch(
    version: int | None,
    out_dir: Path,
    store_dir: Path | None,
    keep_versions: int | None,
    follow: bool,
    run_id: str,
    initial_peers: tuple[str, ...],
    publishers: tuple[str, ...],
    identity_path: Path | None,
    host: str,
    port: int,
    upload_bytes_per_s: float | None,
    timeout_s: float,
    verbose: bool,
) -> None:
    """Fetch a version of a run's weights from every holder at once into OUT (resumes if interrupted)."""
    if not publishers:  # before the heavy imports: a usage error must be instant
        raise click.UsageError("give the run's authorised publisher(s) with --publisher PEER_ID")
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from node.broadcast.fetch import FetchProgress

    _setup_logging(verbose)
    console = Console(stderr=True)
    _sigterm_as_interrupt()
    out_dir.mkdir(parents=True, exist_ok=True)
    with console.status("joining the swarm..."):
        dht, identity = _start_dht(
            identity_path=identity_path,
            initial_peers=initial_peers,
            run_id=run_id,
            host=host,
            port=port,
            timeout_s=timeout_s,
        )
    config = _broadcast_config(
        store_dir or out_dir / ".store",
        list(publishers),
        keep_versions=keep_versions,
        upload_bytes_per_s=upload_bytes_per_s,
    )
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
        target = _export(entry, out_dir)
        console.print(f"[green]v{entry.version} complete[/] ({_human(entry.manifest.total_bytes)}): {target}")

    async def body(broadcast: WeightBroadcast) -> None:
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
        asyncio.run(_with_broadcast(dht, identity, config, body))
    except KeyboardInterrupt:
        console.print("stopped; chunks on disk are kept and a new fetch resumes from them.")
    finally:
        dht.shutdown()


@weights.command("status")
@click.option("--store", "store_dir", type=click.Path(path_type=Path), help="Local chunk store to report on.")
@_network_options
@friendly_errors
def status(
    store_dir: Path | None,
    run_id: str,
    initial_peers: tuple[str, ...],
    publishers: tuple[str, ...],
    identity_path: Path | None,
    host: str,
    port: int,
    upload_bytes_per_s: float | None,
    timeout_s: float,
    verbose: bool,
) -> None:
    """Show a run's versions with their holders and how complete each holder is."""
    from rich.console import Console
    from rich.table import Table

    if not publishers:
        raise click.UsageError("give the run's authorised publisher(s) with --publisher PEER_ID")
    _setup_logging(verbose)
    console = Console()
    dht, identity = _start_dht(
        identity_path=identity_path,
        initial_peers=initial_peers,
        run_id=run_id,
        host=host,
        port=port,
        timeout_s=timeout_s,
    )
    config = _broadcast_config(
        store_dir or Path(tempfile.mkdtemp(prefix="hivenet-status-")), list(publishers)
    )

    async def body(broadcast: WeightBroadcast) -> Any:
        return await broadcast.status(run_id)

    try:
        statuses = asyncio.run(_with_broadcast(dht, identity, config, body))
    finally:
        dht.shutdown()
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
