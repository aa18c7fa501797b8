"""The `--model tiny|hf|DIR` option of the benchmarks that run on either backend, and the model it names.

`hf` builds a `hivenet model init` Llama in a scratch directory (`micro` with `--quick`, `tiny`
otherwise; the pretraining is cached), `DIR` is any Hugging Face model directory, and `tiny` is
the built-in TinyGPT (no `HFModelRef`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.hf_model import quiet_transformers
from training.model_init import init_model_dir
from training.run_model import HFModelRef


def add_model_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="tiny",
        help="tiny (TinyGPT), hf (a `hivenet model init` llama built here: micro with --quick, else tiny) "
        "or a Hugging Face model directory",
    )  # fmt: skip


def chosen_model(choice: str, *, quick: bool, scratch: Path) -> HFModelRef | None:
    """The run's Hugging Face model for `--model choice` (None for `tiny`), built under `scratch` for `hf`."""
    quiet_transformers()
    if choice == "tiny":
        return None
    if choice == "hf":
        return HFModelRef.of_directory(init_model_dir(scratch / "model", size="micro" if quick else "tiny"))
    return HFModelRef.of_directory(choice)
