"""`hivenet model`: build a small Hugging Face model directory here, and describe one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cli.errors import friendly_errors
from cli.output import echo_json, json_option, setup_logging

_FAMILIES = ("llama", "qwen2")
_SIZES = ("micro", "tiny")


@click.group()
def model() -> None:
    """Model directories: create a small one (`init`), or describe one (`info`)."""


@model.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--family", type=click.Choice(_FAMILIES), default="llama", show_default=True, help="Architecture family."
)
@click.option("--size", type=click.Choice(_SIZES), default="tiny", show_default=True,
              help="micro: ~0.1M parameters (tests); tiny: ~3.4M (the demo's).")  # fmt: skip
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the random init and of the pretraining."
)
@click.option("--pretrain-steps", type=click.IntRange(min=0), default=300, show_default=True,
              help="AdamW steps of pretraining on the default corpus (cached by these options).")  # fmt: skip
@friendly_errors
def init(directory: Path, family: str, size: str, seed: int, pretrain_steps: int) -> None:
    """Build a Hugging Face model directory in DIRECTORY, with nothing to download.

    It holds a byte-level BPE tokenizer trained on the default corpus, a chat template, a small
    Llama or Qwen2 config and weights pretrained briefly on the corpus, saved with save_pretrained:
    use it with `--model DIRECTORY`, or load it with transformers' from_pretrained.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    setup_logging()
    from training.hf_model import quiet_transformers

    quiet_transformers()
    from training.model_init import check_target, init_model_dir

    check_target(directory)

    progress = Progress(
        TextColumn("pretraining"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
        TimeRemainingColumn(),
    )  # fmt: skip
    task = progress.add_task("pretrain", total=pretrain_steps, loss="-")

    def report(step: int, steps: int, loss: float) -> None:
        progress.update(task, completed=step, loss=f"{loss:.3f}")

    with progress:
        path = init_model_dir(directory, family=family, size=size, seed=seed, pretrain_steps=pretrain_steps,  # type: ignore[arg-type]
                              progress=report)  # fmt: skip
    click.echo(f"wrote {path}; use it with --model {path}")


@model.command("info")
@click.argument("directory", type=click.Path(path_type=Path))
@json_option
@friendly_errors
def info(directory: Path, as_json: bool) -> None:
    """Describe the model in DIRECTORY: family, size, tokenizer and the content hash of its weights
    (what a run's config names as its starting weights)."""
    setup_logging()
    from training.hf_model import quiet_transformers

    quiet_transformers()
    from training.causal_lm import weights_hash
    from training.hf_model import load_hf_model
    from training.tokenizer import HFTokenizer, check_vocab_fits

    loaded = load_hf_model(directory)
    tokenizer = HFTokenizer(directory)
    check_vocab_fits(tokenizer, loaded.vocab_size, str(directory))
    facts: dict[str, Any] = {
        "family": loaded.family,
        "parameters": loaded.num_parameters(),
        "hidden_size": loaded.hidden_size,
        "max_seq_len": loaded.max_seq_len,
        "vocab_size": loaded.vocab_size,
        "tokenizer_tokens": tokenizer.vocab_size,
        "stop_ids": sorted(tokenizer.stop_ids),
        "chat_template": tokenizer.has_chat_template,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "weights_sha256": weights_hash(loaded.state_dict()),
    }
    if as_json:
        echo_json(facts)
        return
    for key, value in facts.items():
        click.echo(f"{key:>16}: {value}")
