"""Tests for training.generation: seeded, reproducible, proofs built on the fly over the right rows."""

from __future__ import annotations

import pytest
import torch

from protocol.toploc import build_proofs, verify_proofs
from training.generation import ProofBuilder, generate, generate_group
from training.model import ModelConfig, TinyGPT
from training.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(ModelConfig()).to(torch.bfloat16).eval()


PARAMS = SamplingParams(temperature=1.0)


def test_generation_is_reproducible_and_seeded(model):
    a = generate(model, [1, 2, 3], 70, PARAMS, seed=5)
    b = generate(model, [1, 2, 3], 70, PARAMS, seed=5)
    c = generate(model, [1, 2, 3], 70, PARAMS, seed=6)
    assert a.completion_ids == b.completion_ids and a.proofs == b.proofs
    assert a.completion_ids != c.completion_ids
    assert len(a.completion_ids) == 70
    assert len(a.proofs) == 3 and all(len(p) == 258 for p in a.proofs)


def test_proofs_cover_the_rows_that_produced_each_token(model):
    prompt = [10, 20, 30, 40]
    out = generate(model, prompt, 40, PARAMS, seed=1)
    assert out.hidden.dtype == torch.bfloat16 and out.hidden.shape == (40, model.config.d_model)
    assert out.proofs == build_proofs(out.hidden)
    with torch.inference_mode():
        logits, hidden = model.forward_with_hidden(torch.tensor([prompt + out.completion_ids[:-1]]))
    rows = hidden[0, len(prompt) - 1 :].to(torch.bfloat16)
    assert torch.equal(rows, out.hidden)
    assert torch.equal(logits[0, len(prompt) - 1 :], out.logits)
    assert all(c.value_mismatches == 0 for c in verify_proofs(rows, out.proofs))


def test_background_proofs_are_identical(model):
    a = generate(model, [7], 100, PARAMS, seed=2, background_proofs=False)
    b = generate(model, [7], 100, PARAMS, seed=2, background_proofs=True)
    assert a.proofs == b.proofs


def test_a_generation_counts_the_cpu_time_of_its_proofs_on_either_thread(model):
    for background in (False, True):
        proved = generate(model, [7], 100, PARAMS, seed=2, background_proofs=background)
        assert len(proved.proofs) == 4 and proved.proof_cpu_seconds > 0
    assert generate(model, [7], 100, PARAMS, seed=2, prove=False).proof_cpu_seconds == 0.0


def test_stop_tokens_and_limits(model):
    out = generate(model, [1], 50, PARAMS, seed=3)
    stop = out.completion_ids[9]
    first = out.completion_ids.index(stop)
    cut = generate(model, [1], 50, PARAMS, seed=3, stop_ids={stop, 999})
    assert cut.completion_ids == out.completion_ids[: first + 1]
    assert len(cut.proofs) == 1
    with pytest.raises(ValueError):
        generate(model, [], 5, PARAMS, seed=0)
    with pytest.raises(ValueError):
        generate(model, [1], 0, PARAMS, seed=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, [1] * 10, model.config.max_seq_len, PARAMS, seed=0)


def test_choose_overrides_tokens(model):
    greedy = generate(model, [1, 2], 20, PARAMS, seed=4, choose=lambda i, logits, s: int(logits.argmax()))
    with torch.inference_mode():
        logits = model(torch.tensor([[1, 2, *greedy.completion_ids[:-1]]]))[0, 1:]
    assert greedy.completion_ids == logits.argmax(-1).tolist()


def test_proof_builder_partial_chunks():
    torch.manual_seed(0)
    rows = torch.randn(45, 128).to(torch.bfloat16)
    for background in (False, True):
        builder = ProofBuilder(background=background)
        builder.add(rows[:10])
        builder.add(rows[10:45])
        assert builder.finish() == build_proofs(rows)


def test_a_group_decoded_as_one_batch_is_each_seeds_own_generation_on_exact_kernels(model):
    params = SamplingParams(temperature=1.0)
    seeds = [3, 4, 5, 6]
    stops = set(range(0, 256, 16))
    batch = generate_group(model, [72, 105, 33], 40, params, seeds, stop_ids=stops)
    for seed, out in zip(seeds, batch, strict=True):
        alone = generate(model, [72, 105, 33], 40, params, seed, stop_ids=stops)
        assert out.completion_ids == alone.completion_ids
        assert out.proofs == alone.proofs
        assert torch.equal(out.hidden, alone.hidden) and torch.equal(out.logits, alone.logits)
    assert len({tuple(out.completion_ids) for out in batch}) > 1
    assert any(len(out.completion_ids) < 40 for out in batch)  # rows stop on their own


def test_a_group_passes_each_row_to_choose():
    model = TinyGPT(ModelConfig(n_layers=1, d_model=32, n_heads=2, max_seq_len=64)).eval()
    seen: set[int] = set()

    def choose(row: int, i: int, logits: torch.Tensor, sampled: int) -> int:
        seen.add(row)
        return row

    outs = generate_group(model, [1, 2], 5, SamplingParams(), [7, 8, 9], choose=choose)
    assert [out.completion_ids for out in outs] == [[0] * 5, [1] * 5, [2] * 5] and seen == {0, 1, 2}
