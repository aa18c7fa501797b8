"""Models, data, the DiLoCo optimizer and trainer role, and the inference worker's generation loop.

The training loop is plain synchronous torch code that reaches the network only through
interfaces (`diloco.RoundAverager`, `diloco.StateSource`); `averagers` plugs the node's averaging
service (`node.collective.averager.GatherAverager`) into them.

- `causal_lm`: `CausalLM`, the one model interface every consumer uses (`forward_with_hidden`,
  `prefill_cache`/`decode_step`, `forward_shared_prefixes`, `loss`), and `weights_hash`.
- `hf_model`: `HFCausalLM`, `load_hf_model`, `hf_model_from_config` (the `hf` backend: transformers
  causal LMs on native kernels); `model_dir`: `check_model_dir` (what a model directory must hold:
  safetensors only, no remote code); `model_init`: `init_model_dir` (`hivenet model init`).
- `tokenizer`: `Tokenizer`, `ByteTokenizer`, `HFTokenizer` (prompts, chat templates, stop tokens).
- `run_model`: `HFModelRef`, `load_run_model` (a run's hf model and the hash of its starting weights).
- `model`: `ModelConfig`, `TinyGPT` (the `tiny` backend: byte-level causal LM; `forward`, `forward_with_hidden`,
  `loss`, `prefill_cache`, `decode_step`; decode and prefill agree bit for bit at inference).
- `data`: `DataConfig`, `Corpus`, `load_corpus`, `prefetch_shakespeare` (shakespeare plays,
  stdlib fallback, or the user's files; seeded held-out split and disjoint shards).
- `outer_step`: `DiLoCoConfig`, `pseudo_gradient`, `outer_update` (the outer Nesterov step).
- `diloco`: `DiLoCoTrainer`, `OuterStepReport` (inner AdamW steps, overlapped rounds; re-exports
  `outer_step`'s names); the outer state and round types come from `node.collective`.
- `trainer`: `TrainerConfig`, `TrainerRuntime`, `run_trainer` (the trainer role inside a node).
- `trainer_node`: `start_trainer` (a trainer on a running node, publishing every outer step through
  the weight broadcast it hosts, and signing training receipts for the members of its rounds into
  the node's ledger: `sign_training_receipts`).
- `trainer_thread`: `TrainerThread` (one trainer in a background thread: reports, stop, kill).
- `simulation`: `simulate_diloco` (a whole run of N trainers on 127.0.0.1).
- `checkpoint`: safetensors checkpoints (`save_checkpoint`, `load_checkpoint`, `latest_checkpoint`).
- `sampling`: seeded Gumbel-max sampling (`SamplingParams`, `sample_tokens`).
- `generation`: `generate`, which samples and builds TOPLOC proofs every 32 tokens.
- `tasks`: RL tasks with verifiable rewards (`Task`, `TextTask`, `get_task`; line-length, arithmetic,
  countdown; plugins under the `hivenet.tasks` entry point).
- `grpo`: `GRPOConfig`, `ScoredRollout`, `GRPOLearner` (group-relative advantages, two-sided clipped
  token-level loss, behaviour log-probs of rollouts up to `async_level` versions old), `StaleRolloutError`.
- `rl_sync`: `pretrained_policy` (brief, cached pretraining of the RL policy) and `run_sync_grpo`
  (the single-process synchronous GRPO baseline).
- `rl_run`: `RLRunConfig` (what a run's roles agree on, its model included), `run_task`,
  `run_tokenizer`, `initial_policy`, `model_from_state`.
- `policy_updates`: `PolicyUpdates` (how GRPO steps become policy versions), `every_step_updates`.
"""
