"""`launch.export` (recipes/export.py): a run of a tiny float32 policy of each family, started
from a random transformers model saved with `save_pretrained` (as the agent recipes start from
a Hugging Face folder), one SFT step through `Trainer.run` (LoRA adapters on Qwen2.5-VL, the
tied LM head's included, and on Qwen3-VL), exported to a Hugging Face folder whose logits in
transformers' PyTorch model (`from_pretrained`, pixels from the folder's image processor)
equal the restored jaxspatial policy's; `load_policy` reads every tensor back; the
tokenizer, chat template, image processor and generation config load. The demo recipe's
checkpoint exports and `launch.serve`'s server answers a chat completion from the folder.
Missing runs, steps and non-family policies are named errors."""

import base64
import copy
import dataclasses
import importlib
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
import safetensors.numpy
from flax import nnx
from PIL import Image

from jaxspatial.models import apply_lora, linear_names, load_model, load_policy, policy
from jaxspatial.models.chat import ChatFormat, template_prefill
from jaxspatial.models.policy_folder import qwen_chat_template
from jaxspatial.models.qwen2_5_vl import export as qwen2_5_vl_export
from jaxspatial.models.qwen2_5_vl.tokenizer import save_processor
from jaxspatial.rollout import prompts, tiny
from jaxspatial.train import (Checkpointer, Experiment, ExportedPolicy, OptimizerConfig, Phase,
                              StepConfig, Trainer, TrainBatch, flat_config, make_optimizer,
                              mesh_from_config, trainable)
from recipes.export import export_checkpoint
from tests import chat_templates

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYSTEM = "Look."
QUESTION = "Which colour?"
# family -> (image side in pixels: no resize, 4 merged vision tokens; LoRA targets)
FAMILIES = {"qwen2_5_vl": (56, "all+lm_head"), "qwen3_vl": (64, "all"), "qwen3_5": (64, "")}
# Not trained (less to differentiate, less to compile): the vision tower, the input
# embedding and Qwen3.5's Gated DeltaNet (everything else of its layers trains).
FROZEN = ("visual", "embed_tokens", "linear_attn")


class TinySFT(Experiment):
  """A policy loaded from `model.checkpoint` (optionally with LoRA adapters), one SFT step on
  a fixed batch of one-image prompts: the shortest trainer run that leaves a checkpoint."""

  name = "tiny_sft"

  def __init__(self, config, tokenizer):
    self.c, self.tokenizer = config, tokenizer

  def build(self, mesh):
    del mesh
    c = self.c
    model = load_model(c.model.checkpoint, seed=c.seed)
    if c.lora:
      targets = linear_names(model.language_model) + (
          ("lm_head",) if c.lora.endswith("lm_head") else ())
      apply_lora(model.language_model, targets, 4, 8.0, rngs=nnx.Rngs(c.seed + 1))
    return model

  def phases(self):
    return [Phase("sft", 1, OptimizerConfig(learning_rate=1e-3, warmup_steps=0),
                  StepConfig(objective="sft"),
                  trainable=trainable(frozen=FROZEN, adapters_only=bool(self.c.lora)))]

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
    return ExportedPolicy(module, self.tokenizer, source=self.c.model.checkpoint)


def small_config(tokenizer, family: str):
  """The family's tiny config, smaller still (one decoder layer of each kind, one vision
  block: less to compile), with the tokenizer's vocabulary and special ids."""
  base = policy.policy_class(family).config_class.tiny(64)
  text, vision = {"num_hidden_layers": 1}, {"depth": 1}
  if family == "qwen2_5_vl":
    vision["fullatt_block_indexes"] = (0,)
  elif family == "qwen3_vl":
    vision["deepstack_visual_indexes"] = (0,)
  else:
    text = {"num_hidden_layers": 2, "layer_types": ("linear_attention", "full_attention")}
  return tiny.model_config(tokenizer, dataclasses.replace(
      base, text=dataclasses.replace(base.text, **text),
      vision=dataclasses.replace(base.vision, **vision)), family)


def prompt(tokenizer, side: int):
  """A one-image chat prompt's ids (4 vision tokens) and its image."""
  text = prompts.chat_prompt(SYSTEM, QUESTION, 4)
  image = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
  return np.asarray(tokenizer.encode(text, add_special_tokens=False), np.int32), image


def source_folder(folder, tokenizer, family: str) -> pathlib.Path:
  """A random transformers model of the family (every parameter perturbed: norms off 1,
  biases off 0) saved with `save_pretrained`, its tokenizer and image processor, and a
  generation_config.json as Qwen's releases ship it (no chat template)."""
  config = small_config(tokenizer, family)
  fields = config.to_hf()
  torch.manual_seed(0)
  model = transformers.AutoModelForImageTextToText.from_config(
      transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.add_(torch.randn_like(param) * 0.05)
  model.save_pretrained(folder)
  shaped = nnx.eval_shape(lambda: policy.policy_class(family)(config, rngs=nnx.Rngs(0)))
  save_processor(folder, tokenizer, shaped)
  chat_templates.write_generation_config(folder, tokenizer)
  return pathlib.Path(folder)


def config(workdir, family: str, source) -> ml_collections.ConfigDict:
  side, lora = FAMILIES[family]
  return ml_collections.ConfigDict(dict(
      recipe="tiny_sft", name="tiny_sft", seed=0, workdir=str(workdir), resume=True,
      mesh=dict(data=-1, fsdp=1, tensor=1), family=family, lora=lora, side=side,
      model=dict(checkpoint=str(source), dtype="float32", param_dtype="float32",
                 cache_dtype="float32"),
      checkpoint=dict(every=1, keep=3), log_every=1))


@nnx.jit
def _forward(model, ids, images):
  pixels, grids, sequence_grids = model.vision_inputs(images)  # grids: static
  return model(ids, jnp.ones_like(ids, bool), pixels, grids, sequence_grids)


def jax_logits(model, ids, image) -> np.ndarray:
  """The policy's logits of one prompt with its image (preprocessed on device)."""
  return np.asarray(_forward(model, jnp.asarray(ids[None]), jnp.asarray(image[None, None])))[0]


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
  """(config, tokenizer, workdir): a finished one-step run of the family."""
  workdir = tmp_path_factory.mktemp(request.param)
  source = source_folder(tmp_path_factory.mktemp("source"), tok, request.param)
  c = config(workdir, request.param, source)
  Trainer(c, TinySFT(c, tok)).run()
  return c, tok, workdir


def test_the_exported_folder_is_the_restored_policy_in_transformers(trained, tmp_path):
  c, tok, workdir = trained
  out = tmp_path / "policy"
  exported = export_checkpoint(c, out, experiment=TinySFT(c, tok))
  assert (exported.folder, exported.step, exported.family) == (out, 1, c.family)

  # The reference: the checkpoint restored as launch.eval restores it (adapters unmerged).
  restorer = Trainer(c, TinySFT(c, tok))
  assert restorer.restore() == 1
  ids, image = prompt(tok, c.side)
  ours = jax_logits(restorer.module, ids, image)
  theirs = torch_logits(out, ids, image)
  assert np.max(np.abs(ours - theirs)) < 1e-4
  # ... and the trained step is what was written: the policy it started from differs.
  assert np.max(np.abs(torch_logits(c.model.checkpoint, ids, image) - theirs)) > 1e-3

  saved = json.loads((out / "config.json").read_text())
  assert saved["model_type"] == c.family
  if c.lora.endswith("lm_head"):  # the tied head's adapter became an untied head
    assert saved["tie_word_embeddings"] is False
  notes = json.loads((out / "jaxspatial_export.json").read_text())
  assert notes["step"] == 1 and notes["checkpoint"] == str(workdir / "checkpoints/latest/1")
  assert (notes["lora_adapters_merged"] > 0) == bool(c.lora)

  # load_policy (what launch.serve and launch.eval --checkpoint read) holds every tensor
  # written, unchanged.
  processor, loaded = load_policy(out)
  assert type(loaded).family == c.family
  written = safetensors.numpy.load_file(out / "model.safetensors")
  read = importlib.import_module(policy.FAMILIES[c.family][2]).state_dict(loaded)
  assert sorted(read) == sorted(written)
  for name, value in written.items():
    np.testing.assert_array_equal(read[name], value, err_msg=name)
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
  generation = transformers.GenerationConfig.from_pretrained(out)  # the source's
  assert generation.eos_token_id == [tok.convert_tokens_to_ids(t)
                                     for t in ("<|im_end|>", "<|endoftext|>")]
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
                     + str(workdir) + r"/checkpoints/latest \(steps there: 1\)"):
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
  with pytest.raises(ValueError, match=r"the config's recipe is 'tiny_sft', not a training "
                     r"recipe \(one of \['agent', 'look_around', 'thinker3d'\]\)"):
    export_checkpoint(c, out)  # without the experiment: the config names the recipe

  # A step by number; an existing folder is replaced only with overwrite.
  assert export_checkpoint(c, out, step=1, experiment=TinySFT(c, tok)).step == 1
  (out / "stale.txt").write_text("an earlier export's file")
  with pytest.raises(FileExistsError, match="pass --overwrite"):
    export_checkpoint(c, out, experiment=TinySFT(c, tok))
  assert export_checkpoint(c, out, overwrite=True, experiment=TinySFT(c, tok)).step == 1
  assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# -- the demo ------------------------------------------------------------------------------

SMALL_DEMO = {"model.hidden": 64, "model.intermediate": 128, "model.layers": 1,
              "model.vision_hidden": 32, "model.vision_depth": 1, "model.vocab": 500}


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
  with jax.set_mesh(mesh_from_config(c.mesh)):  # as the export builds it: programs shared
    module = experiment.build_for_export(None)
    rng = np.random.default_rng(1)  # trained weights: anything but the initial ones
    nnx.update(module, jax.tree.map(lambda x: x + rng.normal(0, 0.02, x.shape).astype(x.dtype),
                                    nnx.state(module, nnx.Param)))
    saver = Checkpointer(pathlib.Path(c.workdir) / "checkpoints", keep=2, best_metric="reward")
    saver.save(3, module, make_optimizer(module, OptimizerConfig(total_steps=1)),
               {"phase": "rl", "results": {}, "seed": c.seed, "config": flat_config(c)},
               {"reward": 0.5})
    saver.close()

  out = tmp_path / "demo_policy"
  exported = export_checkpoint(c, out, best=True)
  assert (exported.step, exported.family) == (3, "qwen2_5_vl")
  # Exactly the saved weights (the family tests check such folders' logits in transformers),
  # every one of which transformers reads.
  written = safetensors.numpy.load_file(out / "model.safetensors")
  expected = qwen2_5_vl_export.state_dict(module)
  assert sorted(written) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  _, info = transformers.AutoModelForImageTextToText.from_pretrained(out,
                                                                     output_loading_info=True)
  assert not any(info.values()), info
  assert ChatFormat.from_folder(out).stop_ids(experiment.tokenizer) == (
      experiment.tokenizer.convert_tokens_to_ids("<|im_end|>"),)

  _, image = prompt(experiment.tokenizer, 56)
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format="PNG")
  url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
  body = {"model": "demo_policy", "max_tokens": 8, "temperature": 0, "messages": [
      {"role": "system", "content": DEMO_SYSTEM},
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                   {"type": "text", "text": QUESTION}]}]}
  server = load_server(out, "127.0.0.1", 0, max_batch=1, max_context=1024).start()
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
