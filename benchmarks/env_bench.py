"""Act3D environment steps per second: 64 episodes under one jit against a host loop.

    python -m benchmarks.env_bench
    python -m benchmarks.env_bench --episodes 8 --points 50000 --steps 4   # quicker

Cost on a 2-core CPU: about 2 minutes. Both sides step the same episodes (procedural
rooms of `--points` points, 640x480 renders with 3x3 splats) with the same random
actions. The JAX side runs `--steps` steps of all episodes as one compiled
`lax.scan` over a vmapped `act3d.step`. The host side is the public-code style:
one Python environment object per episode, numpy dynamics, Think3D's numpy
renderer, stepped one episode at a time; it is timed on `--host-episodes` episodes
and reported per step.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from data_pipelines.synthetic import make_room, orbit_cameras
from jaxspatial.envs import Task, act3d
from jaxspatial.envs.act3d import Act3DAction, Act3DParams
from jaxspatial.envs.act3d_host import Act3DHostEnv
from jaxspatial.geometry import stack


def make_tasks(num_episodes: int, num_scenes: int, points: int, params: Act3DParams):
  rooms = [make_room(seed, points, num_objects=6) for seed in range(num_scenes)]
  tasks = []
  for episode in range(num_episodes):
    room = rooms[episode % num_scenes]
    centre = np.array(room.bounds_max) / 2
    cameras = orbit_cameras((centre[0], centre[1], 0.8), 2.0, 1.5, 4, params.width,
                            params.height, params.hfov_deg)
    start = jax.tree.map(lambda x, e=episode: x[e % 4], cameras)
    tasks.append(Task.create(room.cloud, cameras, start, scene_min=room.bounds_min,
                             scene_max=room.bounds_max, answer_objects=[0]))
  batch = jax.tree.map(lambda *x: jnp.stack(x), *tasks)
  return rooms, tasks, batch.replace(cloud=stack([t.cloud for t in tasks]))


def random_actions(seed: int, steps: int, episodes: int):
  rng = np.random.default_rng(seed)
  primitive = rng.integers(0, 10, (steps, episodes))
  distance = rng.uniform(0.5, 3.0, (steps, episodes)) * np.where(primitive >= 6, 30.0, 1.0)
  return primitive, distance


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--episodes", type=int, default=64)
  parser.add_argument("--scenes", type=int, default=8)
  parser.add_argument("--points", type=int, default=200_000)
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--host-episodes", type=int, default=4)
  args = parser.parse_args(argv)

  params = Act3DParams()  # 640x480, 3x3 splats, 12 interactions
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.episodes} episodes, "
        f"{args.scenes} scenes of {args.points:,} points, {params.width}x{params.height}")
  rooms, tasks, batch = make_tasks(args.episodes, args.scenes, args.points, params)
  primitive, distance = random_actions(0, args.steps, args.episodes)
  actions = Act3DAction(primitive=jnp.asarray(primitive, jnp.int32),
                        distance=jnp.asarray(distance, jnp.float32),
                        has_distance=jnp.ones(primitive.shape, bool),
                        position=jnp.zeros(primitive.shape + (3,)),
                        look_at=jnp.zeros(primitive.shape + (3,)))

  key = jax.random.key(0)

  @jax.jit
  def rollout(batch, actions):
    _, state = jax.vmap(lambda t: act3d.reset(key, t, params))(batch)

    def one_step(state, action):
      obs, state, _, done, info = jax.vmap(lambda s, a: act3d.step(key, s, a, params))(
          state, action)
      return state, (obs.image[:, ::64, ::64], info["invalid"])  # a sliver, to keep it live

    return jax.lax.scan(one_step, state, actions)

  start = time.perf_counter()
  jax.block_until_ready(rollout(batch, actions))
  compile_and_first = time.perf_counter() - start
  times = []
  for _ in range(3):
    start = time.perf_counter()
    jax.block_until_ready(rollout(batch, actions))
    times.append(time.perf_counter() - start)
  jax_seconds = min(times)
  jax_rate = args.episodes * args.steps / jax_seconds

  host_steps = 0
  start = time.perf_counter()
  for episode in range(args.host_episodes):
    task, room = tasks[episode], rooms[episode % args.scenes]
    env = Act3DHostEnv(np.asarray(room.cloud.xyz), np.asarray(room.cloud.rgb), room.bounds_min,
                       room.bounds_max, np.asarray(task.initial_camera.position),
                       np.asarray(task.initial_camera.forward), params)
    env.render()  # the reset observation, as the JAX side renders it
    for t in range(args.steps):
      env.step(int(primitive[t, episode]), float(distance[t, episode]))
      host_steps += 1
  host_seconds = time.perf_counter() - start
  host_rate = host_steps / host_seconds

  print(f"\n{'environment':<46}{'steps/s':>10}{'ms/step':>10}{'speed-up':>10}")
  print("-" * 76)
  print(f"{'host: numpy dynamics + numpy renderer, 1 by 1':<46}{host_rate:>10.1f}"
        f"{1e3 / host_rate:>10.2f}{'':>10}")
  print(f"{f'jaxspatial: {args.episodes} episodes, vmap + scan, one jit':<46}{jax_rate:>10.1f}"
        f"{1e3 / jax_rate:>10.2f}{jax_rate / host_rate:>9.1f}x")
  print(f"\n(jit compile and first run: {compile_and_first:.1f} s; the reset renders are "
        "included on both sides; target: >= 10x)")


if __name__ == "__main__":
  main()
