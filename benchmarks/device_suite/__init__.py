"""The prepared device benchmark: what a few minutes on one GPU should measure, unattended.

    python -m benchmarks.device_suite [--out outputs/device_suite] [--budget-s 330]
    python -m benchmarks.device_suite --smoke      # every part at tiny sizes, on the CPU
    python -m benchmarks.device_suite --parts rollout --budget-s 250 --deadline-s 270  # a 2nd call
    python -m benchmarks.device_suite --parts recipes --budget-s 540 --deadline-s 570
        [--recipes act3d_grpo think3d_rl peria_or_gigpo]     # the recipes' own call
    make device-bench          # every part but recipes
    make device-bench-recipes  # the recipes part

Cost: at most 6 minutes on one H200 (a watchdog writes the report and ends the run at
`--deadline-s` 345; rollout sizes past the first and the host loop start only when their
estimate fits in `--budget-s` 330, skips are recorded); --smoke 50-58 s on a 2-core
CPU (its XLA compiles at LLVM -O0: it tests the path, its numbers mean nothing). Each
part is caught on its own (the error text goes into the report, the run goes on);
DIR/report.json is rewritten after every part and grid row; one Markdown table per part
is printed at the end.
  versions  jax / jaxlib / flax, CUDA and cuDNN where discoverable, the devices, the host
  pitfalls  known XLA regressions, measured: the f32 scatter-add of an embedding gradient
            (8 x 4096 ids into [151936, 2048]) under index contention against int32 (jax
            #38806 / openxla/xla #46225: a CAS loop on NVIDIA GPUs with jaxlib 0.10.2 to
            0.11.0). The suite runs as launch.train does (jaxspatial/xla_workarounds.py
            sets the workaround flag on an affected install); a subprocess then measures
            the other side: without the flag when it is set, with it when the raw
            scatter bites;
            `jax.ops.segment_sum` layouts (jax #39959)
  renderer  the jit renderer at 1M and 1.5M points, 512x512 and 1024x768, radius 0 / 1,
            1 / 8 / 64 views a call: ms per view, points per second; Open3D (radius 0) and
            Think3D's numpy method (radius 1, one call per resolution, 1M points) on the
            host as ratios; scatter-min throughput (uniform, clustered pixels), the bound
  rollout   compiled Act3D episodes (`episode.rollout`, the program `compile_rollout`
            jits, compiled ahead of time) of a Qwen2.5-VL-3B-shaped random policy in bf16,
            640x480 views, 4 turns x 256 forced tokens, batch 8, 64, 128: compile s, tokens
            and episodes per second; vision / render / decode shares from separately jitted
            components; a profiler trace (DIR/trace); the host loop at batch 8
  train     one GRPO step on the batch-8 trajectories (f32 master weights, bf16 compute,
            remat, 2 micro-batches): tokens per second, MFU from the compiled step's cost
            analysis, peak device memory; then the old log-probabilities recomputed
  decode    Act3D's policy family at long context: 32 greedy decode steps after a cache of
            4k, 16k and 24k tokens, batch 1, bf16 weights (zeros: the work does not depend
            on them) and cache, Qwen3.5-9B's hybrid decoder against Qwen2.5-VL-7B's KV
            decoder (benchmarks/sampler_bench.py's rows at the papers' shapes): tokens per
            second and cache bytes per episode. Last, and only rows that fit the budget
  serving   benchmarks/serving_bench.py on the device: 32 requests at once (prompts 64-1,024
            tokens, replies 8-256) on its small policy, the continuous scheduler against
            the static batcher: tokens per second, p50 / p99 latency, peak memory; only
            with `serving_s` of budget left
            (each a compile of about a minute): `--parts decode --budget-s 250` as a second
            call measures them all
  recipes   (not in the default call: `--parts recipes`) one RL step of the Act3D, Think3D-RL
            and PERIA recipes on their papers' policies (Qwen3.5-9B, Qwen3-VL-4B,
            Qwen3-VL-8B as random weights of the released shapes, decoder layers cut to
            what one device holds, stated), each in its own process: rollout episodes / s
            with and without group-shared prompts, step seconds, update tokens / s and MFU,
            peak memory against the recipe's estimate (recipes.py says how); estimated
            2-4 minutes a recipe (compiles included, not yet measured on a GPU); --smoke:
            the cpu variants' tiny policies, about 150 s on a 2-core CPU (measured)
On an accelerator the rollout's set-up and every compile run on a worker thread beside
the measurements (`--compiles serial` for undisturbed timings, at the cost of minutes).
Order: versions, pitfalls, renderer, rollout batch 8, train, rollout batch 64, host loop,
rollout batch 128, decode.

One module per part (versions, pitfalls, renderer, rollout, train, decode, serving, recipes), beside
core (sizes, clock, report), worker (background compiles), tables and cli (the command
line, run by `__main__`).
"""

from benchmarks.device_suite.cli import main, start_watchdog
from benchmarks.device_suite.core import (DEFAULT_PARTS, PARTS, REPO, Clock, Report, Sizes,
                                          error_text, log, peak_flops, peak_memory_bytes,
                                          run_part)
from benchmarks.device_suite.decode import decode_part
from benchmarks.device_suite.pitfalls import (FTZ_ATOMICS_OPTION, WORKAROUND, pitfall_child,
                                              pitfalls_part, remeasure_with_flag,
                                              without_backend_option)
from benchmarks.device_suite.recipes import (PAPER_POLICIES, fitting_layers, recipe_config,
                                             recipes_part)
from benchmarks.device_suite.renderer import renderer_part
from benchmarks.device_suite.rollout import RolloutBench
from benchmarks.device_suite.serving import serving_part
from benchmarks.device_suite.tables import markdown_table, print_tables
from benchmarks.device_suite.train import TrainPart
from benchmarks.device_suite.versions import versions_part
from benchmarks.device_suite.worker import Job, Worker

__all__ = ["Clock", "DEFAULT_PARTS", "FTZ_ATOMICS_OPTION", "Job", "PAPER_POLICIES",
           "PARTS", "REPO", "Report", "RolloutBench", "Sizes", "TrainPart", "WORKAROUND",
           "Worker", "decode_part", "error_text", "fitting_layers", "log", "main",
           "markdown_table", "peak_flops", "peak_memory_bytes", "pitfall_child",
           "pitfalls_part", "print_tables", "recipe_config", "recipes_part",
           "remeasure_with_flag", "renderer_part", "run_part", "serving_part",
           "start_watchdog", "versions_part", "without_backend_option"]
