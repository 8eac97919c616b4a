"""A small Qwen2-style tokenizer and processor, trained locally, for tests and CPU demos.

Real checkpoints bring their own tokenizer and processor, which `load_processor` reads
from the checkpoint folder with transformers' AutoProcessor. No weights or vocabularies
can be downloaded here, so tests and the demo train a byte-level BPE on their own text
and add Qwen2.5-VL's special tokens with their roles.
"""

from __future__ import annotations

import pathlib

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                  "</tool_call>")


def train_tokenizer(corpus: list[str], vocab_size: int = 512,
                    extra_special_tokens: tuple[str, ...] = ()):
  """A byte-level BPE (Qwen2TokenizerFast) trained on `corpus`, with the special tokens."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
  model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  model.decoder = tokenizers.decoders.ByteLevel()
  specials = list(SPECIAL_TOKENS) + list(extra_special_tokens)
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=specials,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  model.train_from_iterator(corpus, trainer)
  return transformers.Qwen2TokenizerFast(
      tokenizer_object=model, eos_token="<|im_end|>", pad_token="<|endoftext|>",
      additional_special_tokens=specials[1:])


class Processor:
  """Tokenizer + image processor with Qwen2.5-VL's image-token expansion: each
  `<|image_pad|>` becomes one token per merged patch of its image.

  transformers' Qwen2_5_VLProcessor needs torchvision for its video processor; this pair
  needs neither, and `load_processor` returns it when AutoProcessor cannot be built.
  """

  def __init__(self, tokenizer, image_processor, merge_size: int = 2):
    self.tokenizer, self.image_processor, self.merge_size = tokenizer, image_processor, merge_size

  def __call__(self, text: list[str], images=None, return_tensors: str = "np"):
    import numpy as np  # pylint: disable=import-outside-toplevel
    features = {}
    if images:
      features = dict(self.image_processor(images=images, return_tensors="np"))
      counts = iter(int(np.prod(g)) // self.merge_size ** 2 for g in features["image_grid_thw"])
      expanded = []
      for t in text:
        parts = t.split("<|image_pad|>")
        out = parts[0]
        for part in parts[1:]:
          out += "<|placeholder|>" * next(counts) + part
        expanded.append(out.replace("<|placeholder|>", "<|image_pad|>"))
      text = expanded
    encoded = self.tokenizer(text, return_tensors=return_tensors, padding=True)
    return {**dict(encoded), **features}


def save_processor(folder, tokenizer, model=None) -> pathlib.Path:
  """Writes the tokenizer and the image processor config `model` runs with (its
  `image_processor_settings()`: patch, merge and temporal sizes, pixel bounds, mean and std;
  without a model, Qwen2.5-VL's defaults) to `folder`."""
  import transformers  # pylint: disable=import-outside-toplevel
  tokenizer.save_pretrained(folder)
  settings = getattr(model, "image_processor_settings", dict)()
  transformers.Qwen2VLImageProcessorPil(**settings).save_pretrained(folder)
  return pathlib.Path(folder)


def load_processor(folder):
  """AutoProcessor for a checkpoint folder when it can be built (it needs torchvision),
  else the tokenizer and image processor as a `Processor`."""
  import transformers  # pylint: disable=import-outside-toplevel
  folder = pathlib.Path(folder)
  if not (folder / "tokenizer_config.json").is_file():
    raise FileNotFoundError(f"no tokenizer in {folder} (tokenizer_config.json is missing)")
  try:
    return transformers.AutoProcessor.from_pretrained(folder)
  except (ImportError, AttributeError, ValueError, OSError):
    return Processor(transformers.AutoTokenizer.from_pretrained(folder),
                     transformers.AutoImageProcessor.from_pretrained(folder))
