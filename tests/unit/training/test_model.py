"""Tests for training.model: shapes, loss, config validation, and decode == prefill bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError

from training.model import ModelConfig, TinyGPT

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(ModelConfig()).eval()


def test_default_size_is_small(model):
    n = model.num_parameters()
    assert 300_000 <= n <= 5_000_000
    assert model.config.vocab_size == 256


def test_forward_shapes_and_hidden(model):
    ids = torch.randint(0, 256, (2, 17))
    logits = model(ids)
    assert logits.shape == (2, 17, 256)
    logits2, hidden = model.forward_with_hidden(ids)
    assert hidden.shape == (2, 17, model.config.d_model)
    torch.testing.assert_close(logits2, logits)
    # The hidden state is the final norm's output: the LM head maps it to the logits.
    torch.testing.assert_close(model.lm_head(hidden), logits)
    # RMS-normalised with unit gain at init (just below 1: the norm's epsilon is not negligible
    # against the small residual stream of an untrained model).
    ms = hidden.pow(2).mean(-1)
    assert bool(((ms > 0.95) & (ms <= 1.0)).all())


def test_causal(model):
    ids = torch.randint(0, 256, (1, 20))
    other = ids.clone()
    other[0, 15] = (other[0, 15] + 1) % 256
    with torch.inference_mode():
        a, b = model(ids), model(other)
    assert torch.equal(a[0, :15], b[0, :15])
    assert not torch.equal(a[0, 15:], b[0, 15:])


def test_loss_and_backward():
    torch.manual_seed(1)
    model = TinyGPT(ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=64))
    seq = torch.randint(0, 256, (3, 33))
    loss = model.loss(seq[:, :-1], seq[:, 1:])
    assert loss.shape == () and torch.isfinite(loss)
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.5  # near uniform at init
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    targets = seq[:, 1:].clone()
    targets[:, :10] = -100
    assert torch.isfinite(model.loss(seq[:, :-1], targets))


def test_a_few_steps_of_training_reduce_the_loss():
    torch.manual_seed(2)
    model = TinyGPT(ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=64))
    text = torch.tensor(list(b"hello hivenet! " * 20))
    seq = text[:65].unsqueeze(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model.loss(seq[:, :-1], seq[:, 1:]).item()
    for _ in range(30):
        opt.zero_grad()
        loss = model.loss(seq[:, :-1], seq[:, 1:])
        loss.backward()
        opt.step()
    assert loss.item() < first / 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_incremental_decoding_matches_prefill_bit_for_bit(model, dtype):
    m = _copy_in(model, dtype)
    ids = torch.randint(0, 256, (1, 150), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        full_logits, full_hidden = m.forward_with_hidden(ids)
        logits, hidden, cache = m.prefill_cache(ids[:, :10])
        rows_h, rows_l = [hidden], [logits]
        for t in range(10, 150):
            lg, h = m.decode_step(ids[:, t : t + 1], cache)
            rows_h.append(h)
            rows_l.append(lg)
        assert cache.length == 150
        assert torch.equal(torch.cat(rows_h, 1), full_hidden)
        assert torch.equal(torch.cat(rows_l, 1), full_logits)
        # Several tokens at once after a cache works too.
        _, _, cache = m.prefill_cache(ids[:, :50])
        lg, h = m.decode_step(ids[:, 50:80], cache)
        assert torch.equal(h, full_hidden[:, 50:80])
        # ... also for more new tokens than one attention block holds (queries attend block by block).
        _, _, cache = m.prefill_cache(ids[:, :20])
        lg, h = m.decode_step(ids[:, 20:150], cache)
        assert torch.equal(h, full_hidden[:, 20:150]) and torch.equal(lg, full_logits[:, 20:150])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("prefix_len", [0, 1, 12])
def test_sequences_after_a_shared_prefix_get_their_own_prefills_rows(model, dtype, prefix_len):
    """Right-padded sequences after one shared prefix, in one pass: only their real rows come back, bit
    for bit what each sequence gets from a prefill of its own (the padding is never looked at)."""
    m = _copy_in(model, dtype)
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 256, (prefix_len,), generator=g)
    lengths = [3, 1, 70, 0, 9]
    width = max(lengths)
    ids = torch.randint(0, 256, (len(lengths), width), generator=g)
    with torch.inference_mode():
        logits, hidden = m.forward_shared_prefix(prefix, ids, lengths)
        assert hidden.shape == (sum(lengths), m.config.d_model) and logits.shape[0] == sum(lengths)
        for row, (lg, h) in enumerate(zip(logits.split(lengths), hidden.split(lengths), strict=True)):
            if not lengths[row]:
                continue
            alone_logits, alone_hidden = m.forward_with_hidden(
                torch.cat([prefix, ids[row, : lengths[row]]]).unsqueeze(0), outputs_from=prefix_len
            )
            assert torch.equal(h, alone_hidden[0]) and torch.equal(lg, alone_logits[0])
        with pytest.raises(ValueError, match="do not fit"):
            m.forward_shared_prefix(prefix, ids, [1, 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parts_with_prefixes_of_their_own_in_one_pass_get_their_own_prefills_rows(model, dtype):
    """Several prefixes, each with its sequences, in one pass: no part sees another's rows."""
    m = _copy_in(model, dtype)
    g = torch.Generator().manual_seed(7)
    parts = []
    for prefix_len, lengths in ((12, [3, 40, 1]), (0, [5, 2]), (1, [0, 9]), (30, [17])):
        ids = torch.randint(0, 256, (len(lengths), max(lengths)), generator=g)
        parts.append((torch.randint(0, 256, (prefix_len,), generator=g), ids, lengths))
    with torch.inference_mode():
        results = m.forward_shared_prefixes(parts)
        assert len(results) == len(parts)
        for (prefix, ids, lengths), (logits, hidden) in zip(parts, results, strict=True):
            assert hidden.shape == (sum(lengths), m.config.d_model) and logits.shape[0] == sum(lengths)
            alone_logits, alone_hidden = m.forward_shared_prefix(prefix, ids, lengths)
            assert torch.equal(hidden, alone_hidden) and torch.equal(logits, alone_logits)
            for row, (lg, h) in enumerate(zip(logits.split(lengths), hidden.split(lengths), strict=True)):
                if lengths[row]:
                    own_logits, own_hidden = m.forward_with_hidden(
                        torch.cat([prefix, ids[row, : lengths[row]]]).unsqueeze(0), outputs_from=len(prefix)
                    )
                    assert torch.equal(h, own_hidden[0]) and torch.equal(lg, own_logits[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_really_half(model, dtype):
    m = _copy_in(model, dtype)
    ids = torch.randint(0, 256, (1, 40))
    with torch.inference_mode():
        lg, h = m.forward_with_hidden(ids)
        _, ref_h = model.forward_with_hidden(ids)
    assert lg.dtype == dtype and h.dtype == dtype
    diff = (h.float() - ref_h).abs().max().item()
    assert 0 < diff < 0.1  # rounding to the half dtype shows, but only as rounding


def test_config_validation():
    with pytest.raises(ValidationError):
        ModelConfig(d_model=100, n_heads=3)
    with pytest.raises(ValidationError):
        ModelConfig.model_validate({"vocab_size": 256, "bogus": 1})
    with pytest.raises(ValidationError):
        ModelConfig(n_layers=0)
    assert ModelConfig().head_dim == 32


def test_too_long_sequence_raises(model):
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, model.config.max_seq_len + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="batch, time"):
        model(torch.zeros(5, dtype=torch.long))


def test_untied_embeddings():
    m = TinyGPT(ModelConfig(d_model=32, n_layers=1, n_heads=2, tie_embeddings=False))
    assert m.lm_head.weight is not m.tok_emb.weight
    assert m(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 256)


def test_outputs_from_returns_the_tail_rows_unchanged(model):
    ids = torch.randint(0, 256, (1, 60), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        logits, hidden = model.forward_with_hidden(ids)
        tail_logits, tail_hidden = model.forward_with_hidden(ids, outputs_from=45)
    assert torch.equal(tail_hidden, hidden[:, 45:])
    assert torch.equal(tail_logits, logits[:, 45:])
    with pytest.raises(ValueError, match="outputs_from"):
        model.forward_with_hidden(ids, outputs_from=60)


def _copy_in(model: TinyGPT, dtype: torch.dtype) -> TinyGPT:
    """An independent copy of `model` in `dtype`, in eval mode."""
    m = TinyGPT(model.config)
    m.load_state_dict(model.state_dict())
    return m.to(dtype).eval()


def _fresh_forward(m: TinyGPT, ids: torch.Tensor) -> torch.Tensor:
    """Logits of a copy that has never run at inference (so holds no cached wide weights)."""
    clone = TinyGPT(m.config).to(m.dtype)
    clone.load_state_dict(m.state_dict())
    with torch.inference_mode():
        return clone(ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inference_sees_in_place_weight_updates(model, dtype):
    """The float64 weight copies kept for inference follow optimizer steps and copies."""
    m = _copy_in(model, dtype)
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        m(ids)  # fills the caches
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1.01)
    with torch.inference_mode():
        assert torch.equal(m(ids), _fresh_forward(m, ids))
    # A deep copy starts its version counters afresh: whichever number of in-place updates
    # it has seen, it never reuses the original's copy.
    for updates in range(1, 8):
        twin = copy.deepcopy(m)
        with torch.no_grad():
            for _ in range(updates):
                for p in twin.parameters():
                    p.mul_(0.9)
        with torch.inference_mode():
            assert torch.equal(twin(ids), _fresh_forward(twin, ids))
    # load_state_dict copies in place.
    m.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()})
    with torch.inference_mode():
        assert torch.equal(m(ids), _fresh_forward(m, ids))
