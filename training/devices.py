"""Which torch device a node computes on: `--device cpu|cuda|cuda:N|mps`, checked before any work.

A node names its device once (`NodeConfig.device`, `HIVENET_DEVICE`, `--device`); every role it runs
puts its models there. `resolve_device` turns the name into a `torch.device`, refusing one this
machine does not have with a `ModelError` that says what to run instead. Tensors that leave a model
(published weights, pseudo-gradients, proofs, sampled logits) are moved to the CPU by the code that
takes them out, so the network and the verifier never see device memory.
"""

from __future__ import annotations

import torch

from protocol.errors import ModelError

__all__ = ["resolve_device"]


def resolve_device(name: str) -> torch.device:
    """The torch device `name` ("cpu", "cuda", "cuda:N", "mps"), if this process can use it."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ModelError(f"unknown device {name!r}: use cpu, cuda, cuda:N or mps") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(
                f"--device {name}: this machine has no usable CUDA GPU (or this torch build has no CUDA): "
                "run with --device cpu, or install a CUDA build of torch on a machine with an NVIDIA GPU"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ModelError(
                f"--device {name}: this machine has {count} CUDA device(s), numbered 0 to {count - 1}: "
                "pick one of those"
            )
        return device
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ModelError(
                f"--device {name}: Apple's Metal (MPS) backend is not available here: run with --device cpu"
            )
        return device
    raise ModelError(f"unsupported device {name!r}: use cpu, cuda, cuda:N or mps")
