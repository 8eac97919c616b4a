"""What must stay exact on accelerators: on TPU and H100/H200 a default-precision float32
matmul runs in bf16 / TF32 passes, so group statistics, masks and counts never go through
one, and camera poses only at full precision. Checked on the traced programs (XLA on CPU
ignores matmul precision, so the numbers alone cannot show it)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.envs import act3d, think3d
from jaxspatial.envs.task import Task
from jaxspatial.geometry import rigid_inverse
from jaxspatial.rl import PolicyLossConfig
from jaxspatial.rl.advantages import group_normalize, or_gigpo_advantages, rloo_advantages
from jaxspatial.rl.objectives import policy_loss


def _subjaxprs(value):
  if isinstance(value, jex_core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, jex_core.Jaxpr):
    yield value
  elif isinstance(value, (tuple, list)):
    for item in value:
      yield from _subjaxprs(item)


def dot_generals(fn, *args):
  """Every dot_general equation in fn's program, nested jaxprs (jit, cond, while) included."""
  found, stack = [], [jax.make_jaxpr(fn)(*args).jaxpr]
  while stack:
    jaxpr = stack.pop()
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        found.append(eqn)
      for value in eqn.params.values():
        stack.extend(_subjaxprs(value))
  return found


def _is_highest(eqn) -> bool:
  precision = eqn.params["precision"]
  highest = jax.lax.Precision.HIGHEST
  return precision == highest or (isinstance(precision, tuple)
                                  and all(p == highest for p in precision))


def test_advantages_and_the_policy_loss_use_no_matmul():
  rng = np.random.default_rng(0)
  rewards = jnp.asarray(rng.random((4, 8)), jnp.float32)
  assert not dot_generals(group_normalize, rewards)
  assert not dot_generals(rloo_advantages, rewards)
  steps = jnp.asarray(rng.random((4, 8, 3)), jnp.float32)
  valid = jnp.ones((4, 8, 3), bool)
  hashes = jnp.asarray(rng.integers(0, 3, (4, 8, 3)), jnp.uint32)
  assert not dot_generals(lambda *a: or_gigpo_advantages(*a, gamma=0.99, omega=1.0, delta=0.9),
                          rewards, steps, valid, hashes)
  logp = jnp.asarray(-rng.random((4, 16)), jnp.float32)
  mask = jnp.asarray(rng.random((4, 16)) < 0.7)
  for aggregation in ("token-mean", "sequence-mean-token-mean"):
    loss = lambda lp, old, adv, m, a=aggregation: policy_loss(
        lp, old, adv, m, PolicyLossConfig(beta=0.01, aggregation=a), ref_logp_BxL=old)
    assert not dot_generals(loss, logp, logp * 0.9, jnp.ones((4, 16)), mask)


def test_camera_poses_compose_at_full_precision():
  room = make_room(0, 4000, num_objects=3)
  centre = np.array(room.bounds_max) / 2
  cameras = orbit_cameras((centre[0], centre[1], 0.5), 2.0, 1.5, 3, 32, 24)
  task = Task.create(room.cloud, cameras, scene_min=room.bounds_min, scene_max=room.bounds_max)
  params = think3d.Think3DParams(width=32, height=24, pull_back=True)
  for mode in ("ego", "global"):
    action = think3d.Think3DAction.view(1, 30.0, 20.0, mode)
    eqns = dot_generals(lambda t, a: think3d.view_camera(t, a, params), task, action)
    assert eqns and all(_is_highest(e) for e in eqns), mode
  act_params = act3d.Act3DParams(width=32, height=24)
  _, state = act3d.reset(jax.random.key(0), task, act_params)
  for name in ("forward", "turn_left", "turn_up"):
    eqns = dot_generals(lambda s, a: act3d.step(jax.random.key(0), s, a, act_params), state,
                        act3d.Act3DAction.navigate(name))
    assert all(_is_highest(e) for e in eqns), name
  eqns = dot_generals(rigid_inverse, cameras.world_from_camera)
  assert eqns and all(_is_highest(e) for e in eqns)
