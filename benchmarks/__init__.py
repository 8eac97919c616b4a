"""One script per hot path, each printing a comparison with the baseline its issue names,
measured in one run.

- render_bench.py (renderer against Open3D and Think3D's numpy method)
- env_bench.py (64 jitted Act3D episodes against a host loop)
- data_bench.py (tasks generated and loaded per second)
- rl_bench.py (loss + gradient, 64 x 4096 tokens, against numpy; OR-GIGPO)
- projector_bench.py (3D projector forward / backward, compiled FLOPs, its share of a stage-2
  GRPO step: measured on CPU, FLOPs at reference size)
- sampler_bench.py (prefill / decode tokens per second against transformers generate, Qwen2.5-VL
  and Qwen3-VL rows)
- tunix_bench.py (the sampler against Tunix 0.1.7's Sampler on the same weights, greedy tokens
  asserted identical; `make tunix-bench` runs it in its own environment, .venv-tunix)
- loading_bench.py (peak host memory while loading a 580 MB Qwen2.5-VL and a Qwen3-VL-4B-shaped
  8.5 GB checkpoint)
- rollout_bench.py (compiled multi-turn rollouts against the host loop)
- train_bench.py (GRPO steps per second; rollout / log-prob / update shares)
- rl_step_bench.py (one RL step of the Think3D-RL, Act3D and PERIA `:cpu` recipes, each
  group's prompt prefilled once against every row's: rollout seconds in interleaved pairs on
  one batch and policy, step seconds, host bytes)
- device_suite/ (a package, one module per part; `make device-bench`: the prepared GPU run: renderer grid, serving (the
  scheduler against the static batcher), a 3B-shaped bf16 rollout and GRPO update, XLA pitfalls,
  versions -> outputs/device_suite/report.json; `--smoke` on CPU in the tests)
- perception_bench.py (a host callback's per-batch cost against none, OCR images per second,
  judge requests per second against a local endpoint)
- eval_bench.py (`launch.eval --benchmark mindcube_tiny --limit 20` wall time on the real
  question file, against commit e166332's full read)
- claw_bench.py (SpatialClaw's kernel: start, cells per second for a trivial cell and a 480 x
  640 tool round trip, sandboxed against unsandboxed)
- prefix_bench.py (a growing agent conversation: the scheduler reusing its slot against the
  whole prompt prefilled every step; seconds and prompt tokens run)
- serving_bench.py (64 requests at once, prompts 64-2,048 tokens, replies 8-512:
  serving.Scheduler against static_batcher.py (the static batcher it replaced: requests within
  `window_s` in one new-token bucket run as one Engine.generate batch), tiny and small policies;
  tokens/s, p50 / p99 latency, peak memory)
- timing.py (the shared timing helper), rl_setup.py (a recipe's RL phase set up as the trainer
  does, and its rollout timed with and without group-shared prompts, for the step
  benchmarks and the device suite's recipes part)
"""

