"""Models, data, the DiLoCo optimizer and the inference worker's generation loop.

Plain synchronous torch code: the network is reached only through interfaces that `node/`
passes in.

- `model`: `ModelConfig`, `TinyGPT` (byte-level causal LM; `forward`, `forward_with_hidden`,
  `loss`, `prefill_cache`, `decode_step`; decode and prefill agree bit for bit at inference).
- `data`: `DataConfig`, `Corpus`, `load_corpus`, `prefetch_shakespeare` (shakespeare plays,
  stdlib fallback, or the user's files; seeded held-out split and disjoint shards).
- `diloco`: `DiLoCoConfig`, `DiLoCoTrainer`, `OuterStepReport` (inner AdamW, pseudo-gradients,
  outer Nesterov step); the outer state and round types come from `node.averaging`.
- `checkpoint`: safetensors checkpoints (`save_checkpoint`, `load_checkpoint`, `latest_checkpoint`).
- `sampling`: seeded Gumbel-max sampling (`SamplingParams`, `sample_tokens`).
- `generation`: `generate`, which samples and builds TOPLOC proofs every 32 tokens.
"""
