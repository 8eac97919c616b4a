r"""Compiled Act3D rollouts of the tiny random policy: viewer and profiler.

    python -m launch.show_rollouts --config configs/rollout_demo.py
    python -m launch.profile_rollout --config configs/rollout_demo.py --config.batch=32
    xprof server --logdir outputs/rollout_trace --port 8791   (its trace; dev install)

Cost: about 30 s on a 2-core CPU (20 s of it compiling); no accelerator. A random policy
rarely writes a valid call, so `scripted=True` forces the first turns' tool calls (the
policy still runs on every token) and leaves the last turn to the policy; set
`model.checkpoint` to a Qwen2.5-VL folder (config.json, safetensors, tokenizer) to roll out a
real model.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # model and agent as in the papers' configs (configs/agent_recipe.py): checkpoint "" = the
  # tiny random policy and its local tokenizer; the dtype policy (jaxspatial.models.precision)
  c.model = dict(checkpoint="", family="qwen2_5_vl", dtype="float32", param_dtype="float32",
                 cache_dtype="float32", attention="auto", remat=False)
  c.agent = dict(name="act3d", width=112, height=84)
  c.rollout = dict(max_turns=4, max_turn_tokens=48, temperature=1.0, constrained=False)
  c.data = dict(scenes=2, points=20_000)
  c.seed = 0
  c.batch = 4
  c.scripted = True
  c.out = "outputs/rollouts.html"
  c.trace_dir = "outputs/rollout_trace"  # profile_rollout's jax.profiler trace ("": none)
  c.repeats = 3
  return c
