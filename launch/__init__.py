"""Thin commands: flags, then one call into recipes/ (`recipes.cli.run`). Nothing imports them.

Modules:
- thin CLIs (a config flag, then one call into recipes/; nothing imports them): train.py and
  eval.py (recipes.train / recipes.evaluate, every recipe, 3DThinker's stages included),
  build_data.py, show_samples.py, render_demo.py, show_rollouts.py (HTML viewer),
  profile_rollout.py,
- export.py (recipes.export.export_checkpoint: a run's checkpoint, the latest, --step N or
  --best, as a Hugging Face folder --out; prints the folder and step),
- eval.py --benchmark (recipes.benchmark_run: --checkpoint policy folder or --endpoint URL
  --model, --agent think3d|act3d|peria|none (its paper config's agent block, or --config's),
  --seeds, --judge_url),
- build_benchmark.py (SpatialBenchmark: --benchmark NAME --source DIR --data-dir DIR; prints
  scenes, questions and questions per category),
- serve.py (jaxspatial.serving.load_server: a policy folder as an OpenAI-compatible
  chat-completions API; prints the base URL),
- perception_server.py (serves tool families or public perception tool names (`--tools`) with
  model folders (`--models family=/path`) over HTTP with /health), reconstruct_scenes.py (a
  benchmark's Think3D caches: data_pipelines.scene_caches), slurm_gpu.sh (requeues on status
  143), tpu_pod.sh (`make install`)
"""

