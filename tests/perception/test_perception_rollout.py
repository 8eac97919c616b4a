"""Perception tools inside the compiled rollout: a PERIA episode calls `text_ocr` (the real
PP-OCRv4 model on the host) and its observation holds the recognised text, and the SAM 3
tools get the text argument the model wrote (a tiny random SAM 3); a rollout with
a host tool on 8 fake CPU devices equals the single-device rollout; Think3D reconstructs
its scene from the input images inside jit (the full rollout's equality is a `make
train-checks` test: tests/recipes/test_think3d_reconstruction.py)."""

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from jaxspatial.envs import peria
from jaxspatial.envs.task import Task
from jaxspatial.geometry import Camera, PointCloud
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.perception import TextTool
from jaxspatial.rollout import AgentRollout, agents, peria_agent, tiny
from tests.conftest import xla_flags

WIDTH, HEIGHT, HFOV = 256, 96, 60.0
WORDS = "EXIT 24"


def sign_task(words: str = WORDS) -> Task:
  """A scene that is a sign: one point per pixel of a PIL-rendered text image, on a plane
  2 m in front of the initial camera, so its render shows the text."""
  from PIL import Image, ImageDraw, ImageFont  # pylint: disable=import-outside-toplevel
  image = Image.new("RGB", (WIDTH, HEIGHT), "white")
  ImageDraw.Draw(image).text((24, 22), words, fill="black", font=ImageFont.load_default(size=44))
  rgb = np.asarray(image).reshape(-1, 3)
  camera = Camera.from_fov(HFOV, WIDTH, HEIGHT, np.eye(4, dtype=np.float32))
  fx, cx, cy = float(camera.fx), float(camera.cx), float(camera.cy)
  v, u = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
  depth = 2.0
  xyz = np.stack([(u + 0.5 - cx) / fx * depth, (v + 0.5 - cy) / fx * depth,
                  np.full_like(u, depth)], -1).reshape(-1, 3)
  cameras = jax.tree.map(lambda x: x[None], camera)
  return Task.create(PointCloud.create(xyz, rgb), cameras, answer_ids=list(b"24"),
                     max_answer_tokens=16)


def _stack(tasks):
  return jax.tree.map(lambda *x: np.stack(x), *tasks)


@pytest.fixture(scope="module")
def policy():
  tok = tiny.tokenizer()
  return tok, Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(1))


@pytest.fixture(scope="module")
def sam3_folder(tmp_path_factory):
  # pylint: disable=import-outside-toplevel
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from tests.perception.test_segmentation import make_sam3_folder
  return make_sam3_folder(tmp_path_factory)


@pytest.mark.slow
def test_a_peria_episode_reads_the_scene_text_with_the_real_ocr(policy, sam3_folder):
  """One compiled rollout: text_ocr over the whole sign and a box of it (the real
  PP-OCRv4), concept_count given the model's "text_prompt": "chair" and text_segment
  given a "question" it does not take, both the registry's tools on a tiny SAM 3."""
  # pylint: disable=import-outside-toplevel
  from jaxspatial.perception import TOOLS, encode_text, ocr
  tok, model = policy
  backend = ocr.RapidOCRBackend()
  reads = []

  def read(image, box):
    reads.append(box)
    return ocr.text_ocr(image, box, backend=backend)
  width = 320  # concept_count's JSON on this image is about 300 tiny-tokenizer tokens
  tool = TextTool("text_ocr", read, tok, max_tokens=width, timeout_s=120)
  sam = {name: TOOLS[name].bind(sam3_folder) for name in ("concept_count", "text_segment")}
  params = peria.PeriaParams(width=WIDTH, height=HEIGHT, hfov_deg=HFOV, max_images=3,
                             max_turns=3, splat_radius=0)
  agent = agents.PeriaAgent(params).with_perception(
      [tool] + [t.host_tool(tok, width, timeout_s=120) for t in sam.values()])
  run = AgentRollout.create(agent, tok, model, max_turns=3, max_turn_tokens=96,
                            temperature=0.0)
  tasks = _stack([sign_task()] * 4)
  calls = [agent.call_turn("read it", "text_ocr", 0),
           agent.call_turn("read the left half", "text_ocr", 0, [(0, 0), (330, 1000)]),
           agent.call_turn("count", "concept_count", 0, text="chair"),
           agent.call_turn("find", "text_segment", 0, text="chair", text_key="question")]
  assert '"arguments": {"image_index": 0, "text_prompt": "chair"}' in calls[2]
  scripts = [[call, agent.answer_turn("ok", "24")] for call in calls]
  traj = jax.device_get(run(model, tasks, jax.random.PRNGKey(0), forced=run.forced(scripts)))
  assert traj.turn_valid[:, :2].all() and traj.turn_answer[:, 1].all()
  assert (traj.observation_variant[:, 0] == peria_agent.TEXT_VARIANT).all()
  # The render is the sign; the observation after the call is the tool's text for it.
  images = np.asarray(traj.images[:, 0])
  expected = [ocr.text_ocr(images[0], None, backend=backend),
              ocr.text_ocr(images[1], [0, 0, 330, 1000], backend=backend),
              sam["concept_count"].text(images[2], text_prompt="chair"),
              sam["text_segment"].text(images[3], question="chair")]
  for b in range(4):
    start, end = traj.turn_end[0], traj.turn_start[1]
    message = tok.decode(traj.tokens[b, start:end][traj.attention_mask[b, start:end]])
    assert expected[b] in message, (message, expected[b])
  print("text_ocr observations:", expected[:2])
  assert "EXIT" in expected[0] and "24" in expected[0]
  assert "24" not in expected[1]  # the box holds the left word only
  # The SAM 3 rows: exactly the registry tool's text for the model's argument, whole.
  assert '"query":"chair"' in expected[2].replace(" ", "")
  assert expected[3].startswith("Error executing text_segment: unexpected argument 'question'")
  for b in (2, 3):
    ids, mask = encode_text(tok, expected[b], width + 1)
    assert not mask[-1], "the result is cut: widen the tools' max_tokens"
    length = traj.observation_text_length[b, 0]
    np.testing.assert_array_equal(traj.observation_text[b, 0, :length], ids[:mask.sum()])
  assert not traj.image_given[:, 1].any()  # a text result adds no image
  # One host call per turn for the batch; the model runs for the rows that called it.
  assert tool.stats()["tools/text_ocr/calls"] == 2 and reads == [None, [0.0, 0.0, 330.0, 1000.0]]


WORKER = r"""
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jaxspatial.envs import peria
from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
from jaxspatial.models.sharding import make_mesh
from jaxspatial.perception import TextTool
from jaxspatial.rollout import AgentRollout, agents, tiny
from data_pipelines.synthetic import episodes

assert len(jax.devices()) == 8
tok = tiny.tokenizer()
plain = Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(1))
mesh = make_mesh(data=4, fsdp=2, tensor=1)
with jax.set_mesh(mesh):
  sharded = Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(2))
  state = nnx.state(sharded, nnx.Param)
  values = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x), s.sharding),
                        nnx.to_pure_dict(nnx.state(plain, nnx.Param)), nnx.to_pure_dict(state))
  nnx.replace_by_pure_dict(state, values)
  nnx.update(sharded, state)

calls = []
def describe(image, box):
  calls.append(box)
  x0, x1 = (0, image.shape[1]) if box is None else (int(box[0] * image.shape[1] / 1000),
                                                     int(box[2] * image.shape[1] / 1000))
  part = image[:, x0:max(x1, x0 + 1)]
  return "Tool executed successfully.\nResult: " + str(part.reshape(-1, 3).mean(0).round(1).tolist())
tool = TextTool("text_ocr", describe, tok, max_tokens=40)
params = peria.PeriaParams(width=56, height=56, max_images=3, max_turns=3)
agent = agents.PeriaAgent(params).with_perception([tool])
run = AgentRollout.create(agent, tok, plain, max_turns=3, max_turn_tokens=96, temperature=0.0)
tasks, _ = episodes.act3d_tasks(8, seed=5, points=4000)
scripts = [[agent.call_turn("r", "text_ocr", 0, () if b % 2 else [(0, 0), (500 + 50 * b, 1000)])]
           for b in range(8)]
forced = run.forced(scripts)
key = jax.random.PRNGKey(3)
one = jax.device_get(run(plain, tasks, key, forced=forced))
many = jax.device_get(run(sharded, tasks, key, forced=forced, mesh=mesh))
np.testing.assert_array_equal(one.attention_mask, many.attention_mask)
np.testing.assert_array_equal(np.where(one.attention_mask, one.tokens, -1),
                              np.where(many.attention_mask, many.tokens, -1))
np.testing.assert_allclose(one.logprobs, many.logprobs, atol=1e-5)
np.testing.assert_array_equal(one.turn_valid, many.turn_valid)
np.testing.assert_allclose(one.reward, many.reward, atol=1e-6)
assert one.turn_valid[:, 0].all() and len(calls) == 16, len(calls)
print("host-tool rollout on 8 devices equals one device; host calls", len(calls))
"""


@pytest.mark.slow
@pytest.mark.multidevice
def test_a_rollout_with_a_host_tool_on_8_devices_equals_one_device():
  env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"),
             JAX_PLATFORMS="cpu")
  root = pathlib.Path(__file__).resolve().parents[2]
  result = subprocess.run([sys.executable, "-c", WORKER], env=env, cwd=root,
                          capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
  assert "equals one device" in result.stdout


@pytest.mark.slow
def test_a_perception_server_that_dies_mid_rollout_is_the_tools_error_text(policy):
  """The tool runs on a perception server (a real one on 127.0.0.1) that stops after its
  first answer: the second call's observation is the tool's failure, the episode goes on to
  its answer, and nothing hangs."""
  import json  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from jaxspatial.perception import client, server as tool_server
  tok, model = policy

  served = []

  def describe(image, bounding_box=None):
    served.append(bounding_box)
    if len(served) == 2:  # the first turn's batch is answered; then the server is gone
      server.stop()  # stops accepting; this request's answer still goes out
    return "Tool executed successfully.\nResult: " + json.dumps(
        {"mean": round(float(np.asarray(image).mean()), 1)})

  server = tool_server.ToolServer({"text_ocr": describe})
  server.start()
  remote = client.RemoteTool(server.url, "text_ocr", timeout_s=5, retries=1, backoff_s=0.1)
  tool = TextTool("text_ocr", remote, tok, max_tokens=64, timeout_s=30)
  params = peria.PeriaParams(width=56, height=56, max_images=3, max_turns=3)
  agent = agents.PeriaAgent(params).with_perception([tool])
  run = AgentRollout.create(agent, tok, model, max_turns=3, max_turn_tokens=96,
                            temperature=0.0)
  tasks = _stack([sign_task(), sign_task()])
  call = agent.call_turn("read", "text_ocr", 0, ())
  scripts = [[call, call, agent.answer_turn("ok", "24")]] * 2
  start = time.perf_counter()
  traj = jax.device_get(run(model, tasks, jax.random.PRNGKey(0), forced=run.forced(scripts)))
  assert time.perf_counter() - start < 120
  assert traj.turn_answer[:, 2].all()
  messages = []
  for turn in range(2):
    lo, hi = traj.turn_end[turn], traj.turn_start[turn + 1]
    messages.append(tok.decode(traj.tokens[0, lo:hi][traj.attention_mask[0, lo:hi]]))
  assert 'Result: {"mean": ' in messages[0]
  assert "Error executing text_ocr: tool failed: ToolError: tool 'text_ocr'" in messages[1]
  lengths = traj.observation_text_length[0, :2]
  assert (lengths > 0).all()  # both text results recorded for OR-GIGPO's step groups
  assert len(served) == 2



def think3d_reconstruction_case(size: int = 28, points: int = 2048, slots: int = 3):
  """Think3D tasks whose scenes are reconstructed from their input images by the Pi3
  adapter over the tiny torch Pi3 of the reconstruction tests (two real views of three
  camera slots): (reconstructor, the dataset's tasks (a cloud behind the cameras: its views
  are blank), the same tasks with cloud and poses from `perception.reconstruct` on the
  host, the agent)."""
  # Imported here: torch only for the tests that reconstruct.
  # pylint: disable=import-outside-toplevel
  from jaxspatial.envs import think3d
  from jaxspatial.perception import Pi3Reconstructor, reconstruct
  from tests.perception.test_reconstruction import TinyPi3, frames, pinhole
  intrinsics = np.stack([pinhole(size, size, 1.5, "grid")] * slots)
  scenes = [frames(size, size), frames(size, size)[:, :, ::-1]]
  reconstructor = Pi3Reconstructor(TinyPi3())

  def task(cloud, poses, images):
    return Task.create(cloud, Camera.from_matrices(intrinsics, poses), num_input_cameras=2,
                       input_images=images, question_ids=list(b"Which? (A) a (B) b"),
                       answer_choice=1)

  behind = PointCloud.create(np.array([[0.0, 0.0, -5.0], [0.1, 0.0, -5.0]], np.float32))
  dataset = _stack([task(behind, np.stack([np.eye(4)] * slots), s) for s in scenes])
  beforehand = []
  for images in scenes:
    cloud, cameras = reconstruct(images, backend=reconstructor, min_bucket=points)
    beforehand.append(task(cloud, np.asarray(cameras.world_from_camera)[[0, 1, 1]], images))
  agent = agents.Think3DAgent(think3d.Think3DParams(width=size, height=size, max_rounds=2,
                                                    num_prompt_images=slots))
  return reconstructor, dataset, _stack(beforehand), agent


def test_think3d_reconstructs_its_scene_from_the_input_images_at_reset_inside_jit():
  """The rollout's first call (`vmap(agent.reset)`) and then an ego view, under jit:
  online reconstruction (one host call for the batch) gives the tasks, views and numbers
  of the same calls on tasks reconstructed beforehand; a failed call (flag mode) starts
  the episodes done."""
  from jaxspatial.envs import think3d  # pylint: disable=import-outside-toplevel
  from jaxspatial.perception import reconstruction_tool  # pylint: disable=import-outside-toplevel
  reconstructor, dataset, beforehand, agent = think3d_reconstruction_case()
  tool = reconstruction_tool(reconstructor.host_function(2048), 2048, 3)
  keys = jax.random.split(jax.random.PRNGKey(0), 2)

  def start(agent, tasks):  # global views read the bounds and cameras compared below
    images, numbers, state = jax.vmap(agent.reset)(keys, tasks)
    action = think3d.Think3DAction.create(think3d.VIEW, 1, 30.0, 10.0, think3d.EGO)
    obs, state, _, _, _ = jax.vmap(lambda s: think3d.step(keys[0], s, action,
                                                          agent.params))(state)
    return images, numbers, obs.image, state

  got = jax.device_get(jax.jit(lambda t: start(agent.with_reconstruction(tool), t))(dataset))
  expected = jax.device_get(jax.jit(lambda t: start(agent, t))(beforehand))
  assert tool.stats()["tools/reconstruct/calls"] == 1 and tool.stats()[
      "tools/reconstruct/rows"] == 2
  for name, a, b in zip(("input views", "numbers", "view"), got[:3], expected[:3]):
    np.testing.assert_array_equal(a, b, err_msg=name)
  for name in ("cloud", "input_cameras", "initial_camera", "scene_min", "scene_max"):
    jax.tree.map(lambda a, b, name=name: np.testing.assert_array_equal(a, b, err_msg=name),
                 getattr(got[3].task, name), getattr(expected[3].task, name))
  assert not got[3].done.any()
  drawn = (got[2] != 255).any(-1).mean((-1, -2))  # the reconstruction, not the blank dataset
  assert (drawn > 0.02).all(), drawn

  def broken(images, count):
    raise RuntimeError("no GPU")
  flagged = reconstruction_tool(broken, 2048, 3, name="broken", on_error="flag")
  _, _, state = jax.jit(jax.vmap(agent.with_reconstruction(flagged).reset))(keys, dataset)
  assert np.asarray(state.done).all() and not np.asarray(state.task.cloud.valid).any()
