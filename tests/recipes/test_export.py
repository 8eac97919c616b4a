"""`launch.export` (recipes/export.py): a trainer checkpoint of a tiny float32 policy of each
family (two SFT steps through `Trainer.run`; LoRA adapters on Qwen2.5-VL, the tied LM head's
included, and on Qwen3.5) exported to a Hugging Face folder, whose logits in transformers'
PyTorch model (`from_pretrained`, pixels from the folder's image processor) equal the
restored jaxspatial policy's; the tokenizer, chat template, image processor and generation
config load. The demo recipe's checkpoint exports and `launch.serve`'s server answers a chat
completion from the folder. Missing runs, steps and non-family policies are named errors."""

import base64
import copy
import io
import json
import os
import pathlib
import stat
import subprocess
import sys
import urllib.request

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from jaxspatial.models import apply_lora, linear_names, load_policy
from jaxspatial.models.chat import ChatFormat, template_prefill
from jaxspatial.models.policy_folder import qwen_chat_template
from jaxspatial.rollout import prompts, tiny
from jaxspatial.train import (Checkpointer, Experiment, ExportedPolicy, OptimizerConfig, Phase,
                              StepConfig, Trainer, TrainBatch, flat_config, make_optimizer,
                              trainable)
from recipes.export import export_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYSTEM = "Answer about the room."
QUESTION = "What colour is the box on your left?"
# family -> (image side in pixels: no resize, 4 merged vision tokens; LoRA targets)
FAMILIES = {"qwen2_5_vl": (56, "all+lm_head"), "qwen3_vl": (64, None),
            "qwen3_5": (64, "all")}


class TinySFT(Experiment):
  """A tiny random policy of a family (optionally with LoRA adapters), two SFT steps on a
  fixed batch of one-image prompts: the shortest trainer run that leaves a checkpoint."""

  name = "tiny_sft"

  def __init__(self, config, tokenizer):
    self.c, self.tokenizer = config, tokenizer

  def build(self, mesh):
    del mesh
    c = self.c
    model = tiny.model(self.tokenizer, c.family, seed=c.seed)
    if c.lora:
      targets = linear_names(model.language_model) + (
          ("lm_head",) if c.lora.endswith("lm_head") else ())
      apply_lora(model.language_model, targets, 4, 8.0, rngs=nnx.Rngs(c.seed + 1))
    return model

  def phases(self):
    return [Phase("sft", 2, OptimizerConfig(learning_rate=1e-2, warmup_steps=0),
                  StepConfig(objective="sft"),
                  trainable=trainable(adapters_only=True) if self.c.lora else nnx.Param)]

  def train_batch(self, phase, step):
    del phase
    ids, image = prompt(self.tokenizer, self.c.side)
    rng = np.random.default_rng(step)
    rows = 2
    tokens = np.tile(ids, (rows, 1))
    tokens[:, -6:] = rng.integers(10, 300, (rows, 6))  # the "reply" trained on
    loss = np.zeros(tokens.shape, bool)
    loss[:, -6:] = True
    zeros = jnp.zeros(tokens.shape, jnp.float32)
    return TrainBatch(tokens=jnp.asarray(tokens), attention_mask=jnp.ones(tokens.shape, bool),
                      loss_mask=jnp.asarray(loss),
                      images=jnp.asarray(np.stack([image[None]] * rows)),
                      advantages=jnp.zeros(rows, jnp.float32), old_logprobs=zeros,
                      ref_logprobs=zeros)

  def exported_policy(self, module):
    return ExportedPolicy(module, self.tokenizer)


def prompt(tokenizer, side: int):
  """A one-image chat prompt's ids (4 vision tokens) and its image."""
  text = prompts.chat_prompt(SYSTEM, QUESTION, 4)
  image = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
  return np.asarray(tokenizer.encode(text, add_special_tokens=False), np.int32), image


def config(workdir, family: str) -> ml_collections.ConfigDict:
  side, lora = FAMILIES[family]
  return ml_collections.ConfigDict(dict(
      recipe="tiny_sft", name="tiny_sft", seed=0, workdir=str(workdir), resume=True,
      mesh=dict(data=-1, fsdp=1, tensor=1), family=family, lora=lora or "", side=side,
      model=dict(dtype="float32", param_dtype="float32", cache_dtype="float32"),
      checkpoint=dict(every=1, keep=3), log_every=1))


@nnx.jit(static_argnames="grids")
def _forward(model, ids, pixels, grids, sequence_grids):
  return model(ids, jnp.ones_like(ids, bool), pixels, grids, sequence_grids)


def jax_logits(model, ids, image) -> np.ndarray:
  pixels, grids, sequence_grids = model.vision_inputs(jnp.asarray(image[None, None]))
  return np.asarray(_forward(model, jnp.asarray(ids[None]), pixels, grids, sequence_grids))[0]


def torch_logits(folder, ids, image) -> np.ndarray:
  """The folder in transformers: its model (float32), its image processor's pixels."""
  model = transformers.AutoModelForImageTextToText.from_pretrained(
      folder, dtype=torch.float32).eval()
  vision = transformers.AutoImageProcessor.from_pretrained(folder)(images=[image],
                                                                    return_tensors="pt")
  ids = torch.from_numpy(ids[None].astype(np.int64))
  image_id = model.config.image_token_id
  with torch.no_grad():
    return model(input_ids=ids, attention_mask=torch.ones_like(ids),
                 pixel_values=vision["pixel_values"], image_grid_thw=vision["image_grid_thw"],
                 mm_token_type_ids=(ids == image_id).int()).logits[0].numpy()


@pytest.fixture(scope="module")
def tok():
  return tiny.tokenizer()


@pytest.fixture(scope="module", params=list(FAMILIES))
def trained(request, tmp_path_factory, tok):
  """(config, tokenizer, workdir): a finished two-step run of the family."""
  workdir = tmp_path_factory.mktemp(request.param)
  c = config(workdir, request.param)
  Trainer(c, TinySFT(c, tok)).run()
  return c, tok, workdir


def test_the_exported_folder_is_the_restored_policy_in_transformers(trained, tmp_path):
  c, tok, workdir = trained
  out = tmp_path / "policy"
  exported = export_checkpoint(c, out, experiment=TinySFT(c, tok))
  assert (exported.folder, exported.step, exported.family) == (out, 2, c.family)

  # The reference: the checkpoint restored as launch.eval restores it (adapters unmerged).
  restorer = Trainer(c, TinySFT(c, tok))
  assert restorer.restore() == 2
  ids, image = prompt(tok, c.side)
  ours = jax_logits(restorer.module, ids, image)
  theirs = torch_logits(out, ids, image)
  assert np.max(np.abs(ours - theirs)) < 1e-4
  # ... and the trained step is what was written: the untrained policy differs.
  fresh = jax_logits(TinySFT(c, tok).build(None), ids, image)
  assert np.max(np.abs(fresh - theirs)) > 1e-3

  saved = json.loads((out / "config.json").read_text())
  assert saved["model_type"] == c.family
  if c.lora.endswith("lm_head"):  # the tied head's adapter became an untied head
    assert saved["tie_word_embeddings"] is False
  notes = json.loads((out / "jaxspatial_export.json").read_text())
  assert notes["step"] == 2 and notes["checkpoint"] == str(workdir / "checkpoints/latest/2")
  assert (notes["lora_adapters_merged"] > 0) == bool(c.lora)

  # load_policy (what launch.serve and launch.eval --checkpoint read) gives the same policy.
  processor, loaded = load_policy(out)
  assert type(loaded).family == c.family
  np.testing.assert_allclose(jax_logits(loaded, ids, image), theirs, atol=1e-4, rtol=0)
  assert processor.tokenizer.encode("<|im_start|>user\nhi", add_special_tokens=False) == \
      tok.encode("<|im_start|>user\nhi", add_special_tokens=False)

  # The tokenizer, the chat template (Qwen's layout, as the recipes' prompts), the image
  # processor and the generation config load in transformers.
  reloaded = transformers.AutoTokenizer.from_pretrained(out)
  assert len(reloaded) == len(tok) and reloaded.eos_token == "<|im_end|>"
  messages = [{"role": "system", "content": SYSTEM},
              {"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                               "text": QUESTION}]}]
  text = reloaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  assert text == prompts.chat_prompt(SYSTEM, QUESTION, 1)
  generation = transformers.GenerationConfig.from_pretrained(out)
  assert generation.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
  assert transformers.AutoImageProcessor.from_pretrained(out).patch_size == (
      14 if c.family == "qwen2_5_vl" else 16)
  try:  # Qwen's AutoProcessor needs torchvision (its video processor)
    assert transformers.AutoProcessor.from_pretrained(out).tokenizer.chat_template
  except ImportError:
    assert importlib_missing("torchvision")

  files = sorted(p.name for p in out.iterdir())
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "chat_template.jinja", "preprocessor_config.json",
          "generation_config.json"} <= set(files)
  assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in out.iterdir())
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def importlib_missing(name: str) -> bool:
  import importlib.util  # pylint: disable=import-outside-toplevel
  return importlib.util.find_spec(name) is None


def test_a_thinking_chat_format_opens_replies_with_its_prefill(tok):
  tokenizer = copy.deepcopy(tok)  # the module's tokenizer keeps no template
  tokenizer.chat_template = qwen_chat_template("<think>\n")
  assert template_prefill(tokenizer) == "<think>\n"
  tokenizer.chat_template = qwen_chat_template()
  assert template_prefill(tokenizer) == ""
  with pytest.raises(ValueError, match="without special tokens"):
    qwen_chat_template("<|im_end|>")


def test_missing_runs_steps_and_policies_are_named(trained, tmp_path):
  c, tok, workdir = trained
  out = tmp_path / "policy"
  with pytest.raises(FileNotFoundError, match=r"checkpoint step 7 is not under "
                     + str(workdir) + r"/checkpoints/latest \(steps there: 1, 2\)"):
    export_checkpoint(c, out, step=7, experiment=TinySFT(c, tok))
  with pytest.raises(FileNotFoundError, match=f"no latest checkpoint: {tmp_path}/none does "
                     "not exist"):
    export_checkpoint(c, out, checkpoint=str(tmp_path / "none"), experiment=TinySFT(c, tok))
  with pytest.raises(FileNotFoundError, match="no best checkpoint"):
    export_checkpoint(c, out, best=True, experiment=TinySFT(c, tok))
  assert not out.exists()

  class VisionOnly(TinySFT):
    def exported_policy(self, module):
      return ExportedPolicy(module.visual, self.tokenizer)

  with pytest.raises(ValueError, match=r"its policy is a VisionModel, not one of the policy "
                     r"families \['qwen2_5_vl', 'qwen3_5', 'qwen3_vl'\]"):
    export_checkpoint(c, out, experiment=VisionOnly(c, tok))
  with pytest.raises(ValueError, match="config recipe: expected one of"):
    export_checkpoint(c, out)  # "tiny_sft" is no recipe of recipes.RECIPES

  # Step 1 exports too; the folder is then replaced only with overwrite.
  assert export_checkpoint(c, out, step=1, experiment=TinySFT(c, tok)).step == 1
  with pytest.raises(FileExistsError, match="pass --overwrite"):
    export_checkpoint(c, out, experiment=TinySFT(c, tok))
  assert export_checkpoint(c, out, overwrite=True, experiment=TinySFT(c, tok)).step == 2
  assert json.loads((out / "jaxspatial_export.json").read_text())["step"] == 2


# -- the demo ------------------------------------------------------------------------------

SMALL_DEMO = {"model.hidden": 64, "model.intermediate": 128, "model.layers": 1,
              "model.vision_hidden": 32, "model.vocab": 500}


def demo_config(workdir):
  from configs import demo  # pylint: disable=import-outside-toplevel
  c = demo.get_config()
  c.workdir = str(workdir)
  for key, value in SMALL_DEMO.items():
    block, name = key.split(".")
    c[block][name] = value
  return c


def test_the_demo_checkpoint_exports_and_launch_serve_answers_from_it(tmp_path):
  """The demo recipe's module saved as its trainer saves an RL step (latest and best),
  exported through the config's recipe, then served by `load_server` on 127.0.0.1."""
  import recipes  # pylint: disable=import-outside-toplevel
  from jaxspatial.serving import load_server  # pylint: disable=import-outside-toplevel
  from recipes.look_around import SYSTEM as DEMO_SYSTEM  # pylint: disable=import-outside-toplevel
  c = demo_config(tmp_path / "demo")
  experiment = recipes.experiment(c)
  module = experiment.build_for_export(None)
  state = nnx.state(module, nnx.Param)
  leaves = jax.tree.leaves(state)
  noise = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  state = jax.tree.unflatten(jax.tree.structure(state), [
      x + 0.02 * jax.random.normal(k, x.shape) for x, k in zip(leaves, noise)])
  nnx.update(module, state)
  saver = Checkpointer(pathlib.Path(c.workdir) / "checkpoints", keep=2, best_metric="reward")
  saver.save(3, module, make_optimizer(module, OptimizerConfig(total_steps=1)),
             {"phase": "rl", "results": {}, "seed": c.seed, "config": flat_config(c)},
             {"reward": 0.5})
  saver.close()

  out = tmp_path / "demo_policy"
  exported = export_checkpoint(c, out, best=True)
  assert (exported.step, exported.family) == (3, "qwen2_5_vl")
  ids, image = prompt(experiment.tokenizer, 56)
  np.testing.assert_allclose(torch_logits(out, ids, image), jax_logits(module, ids, image),
                             atol=1e-4, rtol=0)
  assert ChatFormat.from_folder(out).stop_ids(experiment.tokenizer) == (
      experiment.tokenizer.convert_tokens_to_ids("<|im_end|>"),)

  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format="PNG")
  url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
  body = {"model": "demo_policy", "max_tokens": 8, "temperature": 0, "messages": [
      {"role": "system", "content": DEMO_SYSTEM},
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                   {"type": "text", "text": QUESTION}]}]}
  server = load_server(out, "127.0.0.1", 0, window_s=0.0, batch_buckets=(1,)).start()
  try:
    request = urllib.request.Request(server.url + "/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
      reply = json.load(response)
  finally:
    server.stop()
  assert reply["model"] == "demo_policy"
  assert reply["choices"][0]["finish_reason"] in ("stop", "length")
  # The prompt the server built is the demo's own: system, the image's 4 tokens, question.
  expected = experiment.tokenizer.encode(prompts.chat_prompt(DEMO_SYSTEM, QUESTION, 4),
                                         add_special_tokens=False)
  assert reply["usage"]["prompt_tokens"] == len(expected)


def test_the_command_line_names_a_missing_step(tmp_path):
  """`python -m launch.export` exits non-zero with the error in one line (nothing built)."""
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "latest" / "4").mkdir(parents=True)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-m", "launch.export", "--config",
                         "configs/demo.py", "--checkpoint", str(workdir), "--step", "9",
                         "--out", str(tmp_path / "out")], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode != 0
  assert (f"launch.export: checkpoint step 9 is not under {workdir}/checkpoints/latest "
          "(steps there: 4)") in done.stderr
  assert not (tmp_path / "out").exists()
