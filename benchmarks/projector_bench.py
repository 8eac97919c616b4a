"""3DThinker's 3D projector: forward and backward time, and the compiled cost.

    python -m benchmarks.projector_bench [--run-reference]

Cost: seconds for the tiny config. The reference config (35.3M parameters, 4 images of
391 tokens -> [4, 1374, 2048]) is reported as FLOPs and bytes from XLA's cost analysis;
`--run-reference` also times it (minutes on a 2-core CPU). Its share of a stage-2 GRPO
step needs the trainer (issue 8) and is not measured here yet.
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


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=int, default=4)
  parser.add_argument("--run-reference", action="store_true")
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


if __name__ == "__main__":
  main()
