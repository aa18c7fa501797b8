"""`--device`: named once per node (flag, HIVENET_DEVICE, config file), checked before any work,
and honoured by every role; the CUDA path runs where a GPU is present."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cli.main import cli
from node.config import NodeConfig, load_config
from protocol.errors import ConfigError, ModelError
from training.devices import resolve_device

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def test_cpu_resolves_and_unknown_names_are_refused() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ModelError, match="unknown device 'tpu'"):
        resolve_device("tpu")


@no_cuda
def test_a_missing_gpu_is_refused_with_the_fix() -> None:
    with pytest.raises(ModelError, match=r"--device cuda: .*no usable CUDA GPU.*run with --device cpu"):
        resolve_device("cuda")
    with pytest.raises(ModelError, match="--device cuda:1"):
        resolve_device("cuda:1")


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the refusal where MPS is missing")
def test_a_missing_mps_backend_is_refused() -> None:
    with pytest.raises(ModelError, match=r"--device mps: .*--device cpu"):
        resolve_device("mps")


def test_the_node_config_takes_a_device_from_file_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "node.toml"
    config_file.write_text('device = "cuda:1"\n')
    assert load_config(config_file).device == "cuda:1"
    monkeypatch.setenv("HIVENET_DEVICE", "mps")
    assert load_config(config_file).device == "mps"
    assert load_config(config_file, device="cpu").device == "cpu"
    with pytest.raises(ConfigError, match=r"unknown device 'gpu0': use cpu, cuda, cuda:N"):
        load_config(None, device="gpu0")
    assert NodeConfig().device == "cpu"


@no_cuda
@pytest.mark.parametrize(
    "args",
    [
        ["join", "--role", "inference", "--device", "cuda", "--publisher", "x", "--new-swarm"],
        ["simulate", "--rl", "--device", "cuda"],
        ["simulate", "--trainers", "2", "--device", "cuda"],
    ],
    ids=["join", "simulate-rl", "simulate-trainers"],
)
def test_the_cli_refuses_a_missing_gpu_before_starting_anything(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    assert "no usable CUDA GPU" in result.output and "--device cpu" in result.output
    assert "Traceback" not in result.output


@no_cuda
def test_the_environment_variable_reaches_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVENET_DEVICE", "cuda")
    result = CliRunner().invoke(cli, ["simulate", "--rl"])
    assert result.exit_code != 0 and "no usable CUDA GPU" in result.output


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_every_role_computes_on_its_device_and_hands_the_network_cpu_tensors(device: str) -> None:
    from training.generation import generate
    from training.grpo import GRPOConfig, GRPOLearner, ScoredRollout
    from training.model import ModelConfig, TinyGPT
    from training.outer_step import pseudo_gradient
    from training.sampling import SamplingParams
    from verification.recompute import recompute_batch

    torch.manual_seed(0)
    reference = TinyGPT(ModelConfig(max_seq_len=64)).eval()
    model = TinyGPT(ModelConfig(max_seq_len=64)).to(resolve_device(device)).eval()
    model.load_state_dict(reference.state_dict())
    params = SamplingParams(temperature=1.0)
    made = generate(model, [1, 2, 3], 40, params, seed=7)
    assert made.hidden.device.type == "cpu" and made.logits.device.type == "cpu"
    if device == "cpu":  # another device's kernels may round differently: equal tokens are not promised
        assert made.completion_ids == generate(reference, [1, 2, 3], 40, params, seed=7).completion_ids

    class Claim:
        prompt_ids = [1, 2, 3]
        completion_ids = made.completion_ids

    ((hidden, logits),) = recompute_batch([Claim()], model)  # type: ignore[list-item]
    assert hidden.device.type == "cpu" and logits.shape[0] == len(made.completion_ids)

    learner = GRPOLearner(model, GRPOConfig(group_size=2))
    group = [
        ScoredRollout([1, 2, 3], made.completion_ids, 1.0, 0, b"g"),
        ScoredRollout([1, 2, 3], made.completion_ids[:5], 0.0, 0, b"g"),
    ]
    learner.step([group])
    assert all(t.device.type == "cpu" for t in learner.state_dict().values())
    delta = pseudo_gradient([p.detach() for p in reference.parameters()], list(model.parameters()))
    assert all(d.device.type == "cpu" for d in delta) and any(bool(d.abs().sum() > 0) for d in delta)
