"""SpatialClaw's models: a tiny jaxspatial policy folder (PolicyChat: the serving prompt
builder and the continuous-batching scheduler) and an OpenAI-compatible endpoint (EndpointChat over
real HTTP to a scripted server on loopback) each drive complete episodes through the
kernel; every feedback block is well formed. The random policy never writes a valid step,
so its episodes run to the step limit. The policy backend's sampled answers follow their
question, not their batch."""

import base64
import io
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from jaxspatial.agents import prompts
from jaxspatial.agents.backends import EndpointChat, PolicyChat, openai_messages
from jaxspatial.agents.kernel import Limits
from jaxspatial.agents.loop import EpisodeInput, LoopConfig, run_episodes
from jaxspatial.perception.judge import ChatEndpoint
from tests.perception.chat_server import ChatServer

LIMITS = Limits(cell_timeout_s=30.0, memory_bytes=2 << 30)
FEEDBACK = re.compile(r"^== Step (\d+) feedback ==\nStatus: (success|error|partial error|not run)"
                      r"[^\n]*\n(.*\n)?Steps left: (\d+)$", re.S)


def _frames(count=2, size=(28, 28), seed=0):
  return np.random.default_rng(seed).integers(0, 255, (count, *size, 3), dtype=np.uint8)


def _check_feedback(result, max_steps):
  assert result.steps, result.error
  for k, step in enumerate(result.steps, 1):
    match = FEEDBACK.match(step.feedback)
    assert match, step.feedback
    assert int(match.group(1)) == k and int(match.group(4)) == max_steps - k
    if step.status == "format":
      assert "did not follow the format" in step.feedback and step.error
    # Only our own lines start at the margin.
    for line in step.feedback.split("\n"):
      assert line.startswith(("  ", "== Step", "Status:", "Output:", "Warnings:", "VLM",
                              "Variables:", "Memory", "Answer", "Images", "Tool calls:",
                              "Checklist", "Steps left:")), line


@pytest.fixture(scope="module")
def policy_folder(tmp_path_factory):
  # pylint: disable=import-outside-toplevel
  from jaxspatial import models
  from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor
  from jaxspatial.rollout import tiny
  from tests import chat_templates
  folder = tmp_path_factory.mktemp("policy") / "tiny-policy"
  tok = tiny.tokenizer()
  model = tiny.model(tok, "qwen2_5_vl", seed=3)
  models.export(model, folder)
  tok.chat_template = chat_templates.INSTRUCT
  save_processor(folder, tok, model)
  chat_templates.write_generation_config(folder, tok)
  return folder


def test_tiny_policy_drives_episodes(policy_folder):
  """Through recipes' PolicyBackend (its scheduler lent as PolicyChat.from_scheduler, seeded
  per run), as launch.eval --checkpoint runs SpatialClaw."""
  from recipes.benchmark_backends import PolicyBackend  # pylint: disable=import-outside-toplevel
  backend = PolicyBackend(policy_folder, max_batch=2)
  tasks = [EpisodeInput(_frames(seed=k), "Which side? A. left B. right", ("left", "right"),
                        question_id=str(k)) for k in range(2)]
  config = LoopConfig(mode="no_tools", max_steps=2, max_tokens=16, plan_max_tokens=16,
                      concurrency=2, kernel_limits=LIMITS)
  with backend.chat_model(1) as chat:
    results = run_episodes(chat, tasks, config)
    stats = chat.stats()
  assert [r.question_id for r in results] == ["0", "1"]
  for result in results:
    assert result.error is None and result.stop in ("max_steps", "answer")
    assert result.plan_error is None and result.plan is not None  # a plan, however odd
    assert result.requests == 1 + len(result.steps)
    _check_feedback(result, 2)
    assert result.stop == "answer" or len(result.steps) == 2
  assert stats["requests"] == sum(r.requests for r in results)
  # Each episode's steps after its first append to the slot its previous step left (the
  # plan has its own prompt: the first step misses), while the two episodes decode together.
  assert stats["appends"] == sum(len(r.steps) - 1 for r in results), (stats, results)
  assert stats["running"] == 0 and stats["failed"] == 0
  # A folder on its own (no benchmark backend) builds the same way; without prefix reuse
  # every step prefills its whole history.
  own = PolicyChat.from_folder(policy_folder, max_batch=2, reuse_prefix=False)
  assert own.name == "tiny-policy" and own.builder.max_images == 128
  with ThreadPoolExecutor(2) as pool:
    replies = list(pool.map(lambda q: own.chat([{"role": "user", "content": q}],
                                               max_tokens=8), ["left?", "right?"]))
  assert all(isinstance(r, str) for r in replies)
  assert own.stats()["requests"] == 2 and own.stats()["completed"] == 2
  assert own.stats()["appends"] == 0
  own.close()


def _decode(url: str) -> np.ndarray:
  assert url.startswith("data:image/png;base64,")
  return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))


def _role(body) -> str:
  system = body["messages"][0]["content"]
  return {prompts.PLAN_SYSTEM: "plan", prompts.SUB_QUERY_SYSTEM: "vlm",
          prompts.SUB_QUERY_THINKING_SYSTEM: "vlm"}.get(system, "step")


STEP_1 = """**Purpose**
Look at the first frame and ask about it.
**Reasoning**
Start simple.
**Next Goal**
Answer.
**Code**
```python
show(InputImages[0][:10, :12], "corner")
print(Metadata["num_frames"], Metadata["options"])
reply = vlm.ask_with_thinking("What colour dominates?", images=[1])
```"""
STEP_2 = STEP_1.split("**Code**")[0] + '**Code**\n```python\nReturnAnswer("B")\n```'


def test_endpoint_drives_an_episode():
  def reply_fn(body):
    kind = _role(body)
    if kind == "plan":
      return ("**Task Analysis**\nx\n**Verification Checklist**\n"
              '[{"priority": "HIGH", "description": "looked at a frame"}]')
    if kind == "vlm":
      return "Mostly grey."
    done = sum(m["role"] == "assistant" for m in body["messages"])
    return STEP_1 if done == 0 else STEP_2

  frames = _frames(3, (20, 30))
  task = EpisodeInput(frames, "Which side? A. left B. right", ("left", "right"))
  config = LoopConfig(max_steps=3, temperature=0.6, max_tokens=512, kernel_limits=LIMITS)
  with ChatServer() as server:
    server.reply_fn = reply_fn
    endpoint = ChatEndpoint(server.base_url, "scripted", api_key_env=None, retries=0)
    [result] = run_episodes(EndpointChat(endpoint), [task], config)
    bodies = [r["body"] for r in server.requests]
  assert result.error is None and result.prediction == "B" and result.stop == "answer"
  _check_feedback(result, 3)
  assert [_role(b) for b in bodies] == ["plan", "step", "vlm", "step"]
  assert all(b["model"] == "scripted" and b["temperature"] == 0.6 for b in bodies)
  assert bodies[0]["max_tokens"] == config.plan_max_tokens and isinstance(
      bodies[0]["messages"][1]["content"], str)  # the plan sees no image
  first = bodies[1]["messages"][1]["content"]
  images = [_decode(p["image_url"]["url"]) for p in first if p["type"] == "image_url"]
  assert len(images) == 3 and all(np.array_equal(a, b) for a, b in zip(images, frames))
  assert bodies[2]["messages"][0]["content"] == prompts.SUB_QUERY_THINKING_SYSTEM
  assert bodies[2]["max_tokens"] == config.tool_limits.vlm_thinking_max_tokens
  sub = bodies[2]["messages"][1]["content"]
  assert np.array_equal(_decode(sub[0]["image_url"]["url"]), frames[1])
  assert sub[1] == {"type": "text", "text": "What colour dominates?"}
  feedback = bodies[3]["messages"][-1]["content"]
  assert feedback[0]["type"] == "text" and "VLM sub-queries:" in feedback[0]["text"]
  assert "3 ['left', 'right']" in feedback[0]["text"]
  assert np.array_equal(_decode(feedback[1]["image_url"]["url"]), frames[0][:10, :12])
  assert "Checklist (0/1 verified)" in result.steps[0].feedback


def test_endpoint_backend_seeds_its_requests():
  """recipes' EndpointBackend lends its endpoint to the loop with the run's seed."""
  from recipes.benchmark_backends import EndpointBackend  # pylint: disable=import-outside-toplevel
  with ChatServer() as server:
    server.reply_fn = lambda body: "hello"
    backend = EndpointBackend(ChatEndpoint(server.base_url, "m", api_key_env=None))
    with backend.chat_model(7) as chat:
      assert chat.chat([{"role": "user", "content": "hi"}]) == "hello"
    assert backend.endpoint.extra_body == {}
    assert server.requests[0]["body"]["seed"] == 7


def test_openai_messages_keep_order_and_text():
  image = np.zeros((4, 5, 3), np.uint8)
  out = openai_messages([{"role": "system", "content": "s"},
                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "image", "image": image}]}])
  assert out[0] == {"role": "system", "content": "s"}
  assert out[1]["content"][0] == {"type": "text", "text": "a"}
  assert _decode(out[1]["content"][1]["image_url"]["url"]).shape == (4, 5, 3)


def test_a_sampled_answer_depends_on_its_question_not_its_batch(policy_folder):
  """PolicyBackend.answers at temperature 1: each row samples with the seed and its
  question's id (launch.eval passes `question_key`), so the same answers come back when
  the batch runs in reverse, and another seed samples apart."""
  # pylint: disable=import-outside-toplevel
  import jax
  from data_pipelines.synthetic import episodes
  from recipes.benchmark_backends import PolicyBackend
  backend = PolicyBackend(policy_folder, temperature=1.0, answer_tokens=12, max_batch=3)
  tasks, _ = episodes.act3d_tasks(3, seed=0)
  tasks = tasks.replace(input_images=_frames(3, seed=4)[:, None],
                        num_input_cameras=np.ones(3, np.int32))
  prompts = ["Answer in one word."] * 3
  ids = [11, 2024, 7]
  flip = lambda x: np.asarray(x)[::-1]
  text = lambda episodes_: [e.prediction for e in episodes_]
  forward = text(backend.answers(tasks, prompts, 5, row_ids=ids))
  backward = text(backend.answers(jax.tree.map(flip, tasks), prompts, 5, row_ids=ids[::-1]))
  assert forward == backward[::-1]
  assert text(backend.answers(tasks, prompts, 6, row_ids=ids)) != forward
