"""PaddleOCR-VL (the VLM behind PERIA's OCR tools) as an OCR backend, through transformers.

`recognize(image, task)` asks the model one of its four element-level tasks with its own
prompts ("OCR:", "Table Recognition:", "Formula Recognition:", "Chart Recognition:") in
the checkpoint's chat template, then decodes greedily. `read` is the "OCR:" answer as one
`TextLine` over the whole image (the model gives no boxes for these tasks), scored by the
generated tokens' geometric-mean probability. PERIA served PaddleOCR-VL-1.5 with vLLM at
temperature 0 and repetition penalty 1.2 (`repetition_penalty=1.2` gives that). No weights
can be downloaded here: `from_pretrained` takes a local Hugging Face folder.
"""

from __future__ import annotations

import json
import math
import pathlib
import threading

import numpy as np

from jaxspatial.perception.ocr import TASKS, TextLine, check_image, pad_to_aspect

TASK_PROMPTS = {
    "ocr": "OCR:",
    "table": "Table Recognition:",
    "formula": "Formula Recognition:",
    "chart": "Chart Recognition:",
}
if tuple(TASK_PROMPTS) != TASKS:  # one task list for the tools and the model
  raise AssertionError(f"TASK_PROMPTS {tuple(TASK_PROMPTS)} != ocr.TASKS {TASKS}")
# The image processor refuses aspect ratios past 200 (smart_resize); pad well inside it.
MAX_ASPECT = 100.0
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
            "pytorch_model.bin.index.json")
_TOKENIZERS = ("tokenizer.json", "tokenizer.model")
_IMAGE_PROCESSORS = ("preprocessor_config.json", "processor_config.json")


def _chat_template_in(folder: pathlib.Path) -> bool:
  if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
    return True
  for name in ("processor_config.json", "tokenizer_config.json"):
    try:
      if "chat_template" in json.loads((folder / name).read_text()):
        return True
    except (OSError, ValueError):
      continue
  return False


def check_folder(folder) -> pathlib.Path:
  """The folder, or an error naming it and each missing piece: FileNotFoundError for
  missing files, ValueError for a config.json of another model."""
  folder = pathlib.Path(folder)
  where = f"PaddleOCRVLBackend.from_pretrained({str(folder)!r})"
  if not folder.is_dir():
    raise FileNotFoundError(f"{where}: no such folder")
  config = folder / "config.json"
  if not config.is_file():
    raise FileNotFoundError(f"{where}: config.json is missing")
  try:
    model_type = json.loads(config.read_text()).get("model_type")
  except (OSError, ValueError, AttributeError) as e:
    raise ValueError(f"{where}: config.json is not a JSON object ({e})") from e
  if model_type != "paddleocr_vl":
    raise ValueError(f"{where}: config.json model_type: expected 'paddleocr_vl', got "
                     f"{model_type!r}")
  missing = []
  if not any((folder / n).is_file() for n in _WEIGHTS):
    missing.append(f"the weights (one of {', '.join(_WEIGHTS)})")
  if not any((folder / n).is_file() for n in _TOKENIZERS):
    missing.append(f"the tokenizer (one of {', '.join(_TOKENIZERS)})")
  if not (folder / "tokenizer_config.json").is_file():
    missing.append("tokenizer_config.json")
  if not any((folder / n).is_file() for n in _IMAGE_PROCESSORS):
    missing.append(f"the image processor (one of {', '.join(_IMAGE_PROCESSORS)})")
  if not _chat_template_in(folder):
    missing.append("the chat template (chat_template.jinja, or a chat_template entry)")
  if missing:
    raise FileNotFoundError(f"{where}: missing {'; '.join(missing)}")
  return folder


def prompt_messages(task: str) -> list[dict]:
  """The one user turn PaddleOCR-VL is asked: the image, then the task's prompt."""
  if task not in TASK_PROMPTS:
    raise ValueError(f"PaddleOCRVLBackend: task must be one of {TASKS}, got {task!r}")
  return [{"role": "user", "content": [{"type": "image"},
                                       {"type": "text", "text": TASK_PROMPTS[task]}]}]


class PaddleOCRVLBackend:
  """PaddleOCR-VL element recognition: `recognize(image, task)` and `read(image)`.

  model: a transformers PaddleOCRVLForConditionalGeneration; processor: its
  PaddleOCRVLProcessor (tokenizer + image processor + chat template). Generation is greedy,
  at most `max_new_tokens`; a lock serialises calls from several host threads.
  """

  name = "paddleocr-vl"

  def __init__(self, model, processor, max_new_tokens: int = 1024,
               repetition_penalty: float = 1.0):
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
      raise ValueError(f"PaddleOCRVLBackend.max_new_tokens: expected an int >= 1, got "
                       f"{max_new_tokens!r}")
    if not (isinstance(repetition_penalty, (int, float)) and repetition_penalty > 0):
      raise ValueError(f"PaddleOCRVLBackend.repetition_penalty: expected a number > 0, got "
                       f"{repetition_penalty!r}")
    self.model, self.processor = model.eval(), processor
    self.max_new_tokens, self.repetition_penalty = max_new_tokens, float(repetition_penalty)
    self._lock = threading.Lock()

  @classmethod
  def from_pretrained(cls, folder, dtype: str = "float32", device: str = "cpu",
                      **settings) -> "PaddleOCRVLBackend":
    """Model and processor from a local Hugging Face folder (checked first: the error names
    the folder and what is missing); `settings` go to the constructor."""
    folder = check_folder(folder)
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    if not isinstance(getattr(torch, str(dtype), None), torch.dtype):
      raise ValueError(f"PaddleOCRVLBackend.from_pretrained: dtype must name a torch dtype "
                       f"(float32, bfloat16, ...), got {dtype!r}")
    try:
      processor = transformers.AutoProcessor.from_pretrained(folder)
      model = transformers.PaddleOCRVLForConditionalGeneration.from_pretrained(
          folder, dtype=getattr(torch, dtype))
    except (OSError, ValueError, KeyError) as e:
      raise ValueError(f"PaddleOCRVLBackend.from_pretrained({str(folder)!r}): could not load "
                       f"the model or processor: {e}") from e
    return cls(model.to(device), processor, **settings)

  def prompt(self, task: str) -> str:
    """The text the processor receives for `task`: the chat template around the prompt."""
    return self.processor.apply_chat_template(prompt_messages(task), add_generation_prompt=True,
                                              tokenize=False)

  def _generate(self, image_HxWx3, task: str) -> tuple[str, float]:
    """(answer, geometric-mean probability of the generated tokens)."""
    import torch  # pylint: disable=import-outside-toplevel
    from PIL import Image  # pylint: disable=import-outside-toplevel
    image = check_image(image_HxWx3, f"PaddleOCRVLBackend.recognize({task!r})")
    text = self.prompt(task)  # refuses unknown tasks
    picture = Image.fromarray(pad_to_aspect(image, MAX_ASPECT))
    with self._lock:
      inputs = self.processor(text=[text], images=[picture], return_tensors="pt")
      inputs = inputs.to(self.model.device)
      with torch.inference_mode():
        out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False,
                                  num_beams=1, repetition_penalty=self.repetition_penalty,
                                  output_scores=True, return_dict_in_generate=True)
        steps = self.model.compute_transition_scores(out.sequences, out.scores,
                                                     normalize_logits=True)
    generated = out.sequences[0, inputs["input_ids"].shape[1]:]
    answer = self.processor.decode(generated, skip_special_tokens=True).strip()
    logprobs = steps[0].float().cpu().numpy()
    logprobs = logprobs[np.isfinite(logprobs)]
    score = math.exp(float(logprobs.mean())) if logprobs.size else 0.0
    return answer, score

  def recognize(self, image_HxWx3, task: str = "ocr") -> str:
    """The model's answer for `task` in TASKS (LaTeX for formulas, its table markup for
    tables, ...); ValueError for another task."""
    return self._generate(image_HxWx3, task)[0]

  def read(self, image_HxWx3) -> list[TextLine]:
    """The "OCR:" answer as one line over the whole image; [] when it is empty."""
    answer, score = self._generate(image_HxWx3, "ocr")
    if not answer:
      return []
    height, width = np.shape(image_HxWx3)[:2]
    box = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float32)
    return [TextLine(box, answer, score)]
