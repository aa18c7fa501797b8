"""`hivenet model init` and `hivenet model info` as a user runs them, bad directories included."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.test_cli_basics import hivenet


def test_init_builds_a_model_directory_that_info_describes_and_bad_ones_are_one_line_errors(
    tmp_path: Path,
) -> None:
    target = tmp_path / "micro"
    built = hivenet("model", "init", str(target), "--size", "micro", "--pretrain-steps", "2", timeout_s=300)
    assert built.returncode == 0, built.stderr[-3000:]
    assert f"--model {target}" in built.stdout
    described = hivenet("model", "info", str(target), "--json")
    assert described.returncode == 0, described.stderr[-3000:]
    facts = json.loads(described.stdout)
    assert facts["family"] == "llama" and facts["vocab_size"] == facts["tokenizer_tokens"] == 512
    assert len(facts["weights_sha256"]) == 64 and facts["chat_template"] is True

    again = hivenet("model", "init", str(target), "--size", "micro")
    assert again.returncode == 1 and "already holds a model" in again.stderr
    (target / "model.safetensors").rename(target / "pytorch_model.bin")
    refused = hivenet("model", "info", str(target))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("error:") and "pickle" in refused.stderr
