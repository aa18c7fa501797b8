"""The `hf` backend: each supported family behind the CausalLM interface, with the final hidden
state TOPLOC proves, and decoding, shared-prefix passes and weights hashes that agree."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import transformers

from training.causal_lm import CausalLM, weights_hash
from training.hf_model import PACKED_TOKENS, HFCausalLM, hf_model_from_config

SMALL: dict[str, Any] = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def _config(family: str) -> Any:
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    if family == "qwen3":
        return transformers.Qwen3Config(**SMALL, head_dim=8)
    config_class = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }
    return config_class[family](**SMALL)


FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gpt2"]


def _final_norm(model: HFCausalLM) -> torch.nn.Module:
    base = model.hf.base_model
    norm = base.ln_f if model.family == "gpt2" else base.norm
    assert isinstance(norm, torch.nn.Module)
    return norm


@pytest.fixture(scope="module", params=FAMILIES)
def model(request: pytest.FixtureRequest) -> HFCausalLM:
    return hf_model_from_config(_config(request.param), seed=3)


@torch.inference_mode()
def test_the_final_hidden_state_is_the_output_of_the_final_norm_and_the_head_reads_it(
    model: HFCausalLM,
) -> None:
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(0))
    seen: dict[str, torch.Tensor] = {}
    handle = _final_norm(model).register_forward_hook(lambda _m, _i, out: seen.__setitem__("out", out))
    try:
        logits, hidden = model.forward_with_hidden(ids)
    finally:
        handle.remove()
    assert isinstance(model, CausalLM)
    assert torch.equal(hidden, seen["out"])
    assert torch.equal(logits, model.hf(input_ids=ids).logits)
    assert hidden.shape == (2, 11, model.hidden_size) and logits.shape == (2, 11, model.vocab_size)
    tail_logits, tail_hidden = model.forward_with_hidden(ids, outputs_from=4)
    assert torch.equal(tail_hidden, hidden[:, 4:]) and torch.equal(tail_logits, logits[:, 4:])


@torch.inference_mode()
def test_a_half_precision_model_computes_its_logits_in_float32_from_its_own_hidden_states(
    model: HFCausalLM,
) -> None:
    half = hf_model_from_config(model.hf.config, seed=3).to(torch.bfloat16)
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(1))
    for logits, hidden in (half.forward_with_hidden(ids), half.prefill_cache(ids)[:2]):
        assert hidden.dtype == torch.bfloat16 and logits.dtype == torch.float32
        head = half.hf.get_output_embeddings()
        expected = torch.nn.functional.linear(
            hidden.float(), head.weight.float(), None if head.bias is None else head.bias.float()
        )
        assert torch.equal(logits, expected)


@torch.inference_mode()
def test_cached_decoding_matches_one_full_pass(model: HFCausalLM) -> None:
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    _, hidden = model.forward_with_hidden(ids)
    _, first, cache = model.prefill_cache(ids[:, :7])
    rows = [first]
    for i in range(7, 12):
        rows.append(model.decode_step(ids[:, i : i + 1], cache)[1])
    # native kernels: decoding sums in another order than the full pass, so equal up to rounding only
    torch.testing.assert_close(torch.cat(rows, dim=1), hidden, rtol=1e-4, atol=1e-5)


@torch.inference_mode()
@pytest.mark.parametrize("layout", ["packed", "bucketed"])
def test_shared_prefix_passes_match_one_pass_per_sequence(model: HFCausalLM, layout: str) -> None:
    # bucketed: every part counts as long, so it gets a pass of its own (prefix cached, buckets)
    model = HFCausalLM(model.hf, packed_tokens=PACKED_TOKENS if layout == "packed" else 0)
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    _, hidden = model.forward_with_hidden(ids)
    _, alone = model.forward_with_hidden(torch.cat([ids[0, :5], ids[1, 5:9]]).unsqueeze(0))
    _, other = model.forward_with_hidden(ids[1:, :8])
    continuations = ids[:, 5:].clone()
    continuations[1, 4:] = 0  # right padding after the second continuation's 4 real tokens
    three = torch.stack([ids[0, 5:], ids[1, 5:], ids[1, 5:]])
    parts = [
        (ids[0, :5], continuations, [7, 4]),
        (ids[0, :5], three, [7, 0, 2]),  # an empty continuation among them
        (ids[1, :3], ids[1:, 3:], [5]),  # another prefix, of another length, in the same pass
    ]
    (logits, shared), (_, mixed), (_, third) = model.forward_shared_prefixes(parts)
    assert shared.shape == (11, model.hidden_size) and logits.shape == (11, model.vocab_size)
    # native kernels: equal up to the rounding of another layout
    close = functools.partial(torch.testing.assert_close, rtol=1e-4, atol=1e-5)
    close(shared[:7], hidden[0, 5:])
    close(shared[7:], alone[0, 5:])
    assert mixed.shape == (9, model.hidden_size)
    close(mixed[:7], hidden[0, 5:])
    close(mixed[7:], alone[0, 5:7])
    close(third, other[0, 3:])


def test_the_state_dict_uses_the_checkpoint_names_and_hashes_by_content(model: HFCausalLM) -> None:
    assert model.state_dict().keys() == model.hf.state_dict().keys()
    again = hf_model_from_config(model.hf.config, seed=3)
    other = hf_model_from_config(model.hf.config, seed=4)
    assert weights_hash(again.state_dict()) == weights_hash(model.state_dict())
    assert weights_hash(other.state_dict()) != weights_hash(model.state_dict())
    other.load_state_dict(model.state_dict())
    assert weights_hash(other.state_dict()) == weights_hash(model.state_dict())
    assert weights_hash(model.to(torch.bfloat16).state_dict()) != weights_hash(again.state_dict())
    model.to(torch.float32)


def test_sequences_longer_than_the_model_are_refused(model: HFCausalLM) -> None:
    with pytest.raises(ValueError, match="max_seq_len"):
        model.forward_with_hidden(torch.zeros(1, model.max_seq_len + 1, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.inference_mode()
def test_on_cuda_generation_and_the_verifier_pass_agree_with_the_cpu_model(model: HFCausalLM) -> None:
    from training.generation import generate
    from training.sampling import SamplingParams

    gpu = hf_model_from_config(model.hf.config, seed=3).to("cuda")
    out = generate(gpu, [1, 2, 3], 20, SamplingParams(), seed=5, stop_ids=())
    assert len(out.completion_ids) == 20 and out.hidden.device.type == "cpu"
    ids = torch.tensor([[1, 2, 3, *out.completion_ids]])
    _, on_gpu = gpu.forward_with_hidden(ids.to("cuda"))
    _, on_cpu = model.forward_with_hidden(ids)
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-3, atol=1e-3)
