"""3DThinker's 3D projector: forward and backward time, the compiled cost, and its share of
a stage-2 GRPO step.

    python -m benchmarks.projector_bench [--run-reference] [--skip-step]

Cost: about 2 minutes on a 2-core CPU. Tables:
1. The projector alone, tiny and reference configs (35.3M parameters, 4 images of 391
   tokens -> [4, 1374, 2048]): FLOPs and bytes from XLA's cost analysis, and times
   (the reference one only with `--run-reference`, minutes here).
2. Its share of a stage-2 GRPO step, measured, on the CPU variant
   (configs/thinker3d_stage2.py:cpu, one step of 4 prompts x 8 samples): the step's parts
   (rollout with the on-device rewards, old and reference log-probabilities, update) and
   the projector's forward on the step's shapes.
3. The reference configuration's share in FLOPs (too slow to run here): the projector's
   forward per sample against Qwen2.5-VL-3B passes over one sample's sequence (4 views of
   391 tokens + text), counted from the lowered programs with abstract parameters. A step
   costs per sample about one forward for the rollout (decoding with a KV cache does one
   forward's work), one each for the old and reference log-probabilities, and a
   forward + backward for the update (LoRA: the backward still runs through every layer).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.timing import timed
from jaxspatial.models import TINY, Projector3D, Projector3DConfig, alignment_loss


def programs(config: Projector3DConfig, num_images: int):
  model = Projector3D(config, rngs=nnx.Rngs(0))
  graph, params = nnx.split(model)
  latents = jnp.ones((config.latent_size, config.mm_hidden_size))
  images = jnp.ones((num_images, config.fusion_input, config.mm_hidden_size))
  target = jnp.ones((num_images, config.fusion_output, config.hidden_size))

  def forward(params, latents, images):
    return nnx.merge(graph, params)(latents, images)

  def loss(params, latents, images):
    return alignment_loss(forward(params, latents, images), target)

  args = (params, latents, images)
  return jax.jit(forward), jax.jit(jax.value_and_grad(loss)), args


def cost(fn, args) -> tuple[float, float]:
  analysis = fn.lower(*args).compile().cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return float(analysis.get("flops", float("nan"))), float(analysis.get("bytes accessed",
                                                                        float("nan")))


def stage2_step_share() -> None:
  """Times one stage-2 step's parts (the trainer's RL step on the CPU variant, from an
  untrained stage-1 checkpoint), and the projector's forward."""
  import tempfile  # pylint: disable=import-outside-toplevel

  import numpy as np  # pylint: disable=import-outside-toplevel

  from configs import thinker3d_stage1, thinker3d_stage2  # pylint: disable=import-outside-toplevel
  from jaxspatial.train import (Checkpointer, ReferencePolicy, make_optimizer,  # pylint: disable=import-outside-toplevel
                                mesh_from_config, rl_step)
  from recipes.thinker3d import Thinker3D  # pylint: disable=import-outside-toplevel

  root = tempfile.mkdtemp()
  data = dict(train=32, test=8, cache=f"{root}/data")
  first = thinker3d_stage1.get_config("cpu")
  first.data.update(**data)
  mesh = mesh_from_config(first.mesh)
  with jax.set_mesh(mesh):
    stage1 = Thinker3D(first)
    policy = stage1.build(mesh)
    optimizer = make_optimizer(policy, stage1.phases()[0].optimizer_config())
  saver = Checkpointer(f"{root}/stage1/checkpoints")
  saver.save(0, policy, optimizer, {"phase": "sft"})
  saver.close()
  c = thinker3d_stage2.get_config("cpu")
  c.data.update(**data)
  c.init_from = f"{root}/stage1"
  job = Thinker3D(c)
  with jax.set_mesh(mesh):
    model = job.build(mesh)
  phase = job.phases()[0]
  optimizer = make_optimizer(model, phase.optimizer_config(), phase.trainable, mesh=mesh)
  reference = ReferencePolicy.create("lora_disabled", model)
  group = c.advantage.group_size
  index = np.repeat(np.arange(c.rl.prompts), group)

  def parts(key):
    times = {}
    rl_step(job, phase, 0, key, model, optimizer, mesh, reference, timings=times)
    return {"rollout (with rewards)": times["rollout"],
            "old + reference log-probs": times["logprobs"], "update": times["update"]}

  parts(jax.random.PRNGKey(0))  # compile
  runs = [parts(jax.random.PRNGKey(k)) for k in (1, 2, 3)]
  times = {name: float(np.median([r[name] for r in runs])) for name in runs[0]}
  out = job.sample(job.train, index, jax.random.PRNGKey(4), c.rollout.temperature)
  rows = job.policy.image_embeddings(
      jnp.zeros((len(index), job.train.prompt_ids.shape[1], model.config.text.hidden_size)),
      jnp.asarray(job.train.prompt_ids[index]), 3)
  project = nnx.jit(lambda policy, latents, images: policy.project(latents, images))
  projector_s = timed(lambda: project(job.policy, out.latents, rows), 5)
  total = sum(times.values())
  print(f"\nstage-2 GRPO step, CPU variant ({c.rl.prompts} prompts x {group} samples, "
        f"{len(index)} sequences of {out.tokens.shape[1]} slots; projector "
        f"{job.policy.projector.config.parameter_count():,} params)")
  print(f"{'part':<28}{'ms':>10}{'share':>9}")
  print("-" * 47)
  for name, value in times.items():
    print(f"{name:<28}{1e3 * value:>10.1f}{100 * value / total:>8.1f}%")
  print(f"{'step':<28}{1e3 * total:>10.1f}")
  print(f"{'projector forward (inside)':<28}{1e3 * projector_s:>10.2f}"
        f"{100 * projector_s / total:>8.2f}%")


def reference_step_share(num_images: int = 4, text_tokens: int = 700) -> None:
  """The reference projector's FLOPs per sample against Qwen2.5-VL-3B's passes."""
  from jaxspatial.models.qwen2_5_vl import Qwen25VL, Qwen25VLConfig  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen2_5_vl.preprocess import image_grid  # pylint: disable=import-outside-toplevel

  config = Qwen25VLConfig(image_token_id=151655)
  abstract = nnx.eval_shape(lambda: Qwen25VL(config, rngs=nnx.Rngs(0)))
  graph, state = nnx.split(abstract)
  grid = image_grid(config.vision, (480, 640))  # 640x480 frames -> 23 x 17 merged tokens
  per_image = grid[0] * grid[1] * grid[2] // config.vision.spatial_merge_size ** 2
  length = num_images * per_image + text_tokens
  ids = jax.ShapeDtypeStruct((1, length), jnp.int32)
  mask = jax.ShapeDtypeStruct((1, length), jnp.bool_)
  pixels = jax.ShapeDtypeStruct((num_images * grid[0] * grid[1] * grid[2],
                                 config.vision.patch_dim), jnp.float32)
  grids = (tuple(grid),) * num_images
  sequence_grids = jax.ShapeDtypeStruct((1, num_images, 3), jnp.int32)

  def forward(state, ids, mask, pixels, sequence_grids):
    return nnx.merge(graph, state)(ids, mask, pixels, grids, sequence_grids)

  lowered = jax.jit(forward).lower(state, ids, mask, pixels, sequence_grids)
  analysis = lowered.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  model_flops = float(analysis["flops"])
  forward_p, _, inputs = programs(Projector3DConfig(), num_images)
  projector_flops, _ = cost(forward_p, inputs)
  step = 6 * model_flops + projector_flops  # rollout, old, ref: 1 each; update: 3
  print(f"\nreference (FLOPs): Qwen2.5-VL-3B over {length} tokens ({num_images} x "
        f"{per_image} image tokens + {text_tokens} text), per sample")
  print(f"{'program':<40}{'TFLOP':>10}{'share':>9}")
  print("-" * 59)
  print(f"{'model forward':<40}{model_flops / 1e12:>10.3f}")
  print(f"{'stage-2 step (~6 forwards + projector)':<40}{step / 1e12:>10.3f}")
  print(f"{'projector forward (reward)':<40}{projector_flops / 1e12:>10.4f}"
        f"{100 * projector_flops / step:>8.2f}%")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=int, default=4)
  parser.add_argument("--run-reference", action="store_true")
  parser.add_argument("--skip-step", action="store_true", help="only the projector table")
  args = parser.parse_args(argv)
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.images} images\n")
  print(f"{'config':<12}{'params':>12}{'pass':>10}{'GFLOP':>10}{'GB moved':>10}{'ms':>10}")
  print("-" * 64)
  for name, config in (("tiny", TINY), ("reference", Projector3DConfig())):
    forward, backward, inputs = programs(config, args.images)
    for label, fn in (("forward", forward), ("fwd+bwd", backward)):
      flops, moved = cost(fn, inputs)
      run = name == "tiny" or args.run_reference
      ms = f"{1e3 * timed(lambda: fn(*inputs), 3):.2f}" if run else "-"
      print(f"{name:<12}{config.parameter_count():>12,}{label:>10}{flops / 1e9:>10.2f}"
            f"{moved / 1e9:>10.3f}{ms:>10}")
  if not args.skip_step:
    stage2_step_share()
    reference_step_share(args.images)


if __name__ == "__main__":
  main()
