"""3DThinker's published data: the training JSONL (3DThinker-10K, `data/example.jsonl`), its
frames, the VGGT feature cache, and MindCube-Tiny as the held-out questions.

Training rows (the public stage-1 JSONL; stage 2 converts the same rows: problem =
`text_input`, response = `answer`, images = `image_input`):
  text_input   the question with its options ("... A. x B. y C. z")
  image_input  the frames, paths relative to the image root (`data/other_all_image_resize/...`)
  text_output  `<output_3D>` then `<think>...</think>` and `<answer>...</answer>` (stage 1's
               target; the placeholder becomes the latent block)
  answer       "X. option text": the option letter is stage 2's answer
  idx          the key of the row's VGGT features, `<root>/feature_vggt/{idx}/vggt.npz`
  (mindcube_input, mindcube_output: MindCube's own prompt and answer, not read)

What the public code does with them, and so this module:
- the user turn holds the frames, then `text_input` + INSTRUCTION (stage 1's PROMPT and
  stage 2's question template, the "begin" variant: the latent block opens the reply); no
  system message, so Qwen2.5-VL's chat template writes its default one (SYSTEM);
- frames are 480 wide x 640 tall: the feature script resizes every frame with PIL
  `resize((480, 640), LANCZOS)` into `other_all_image_resize/` before VGGT, and training
  reads those files; Qwen's smart resize takes them to 476 x 644, 17 x 23 = 391 merged
  tokens, the projector's hard-wired `fusion_input`. `load_frames` applies the same resize
  to a frame of any other size (MindCube-Tiny's raw frames included), so every prompt has
  391 tokens per frame;
- the held-out evaluation is MindCube-Tiny (the public eval script: its questions + the
  same INSTRUCTION, greedy decoding), read by `readers.mindcube`.

Errors name the file, the row, the idx and the field (`Thinker3DFormatError`, a
`readers.BenchmarkFormatError`); a missing frame names its path (`MissingFrameError`, a
`FileNotFoundError`), a missing feature file its idx and path (`MissingFeaturesError`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import numpy as np

from jaxspatial import errors
from data_pipelines import caches
from data_pipelines.readers.common import (BenchmarkFormatError, MissingImageError, check_file,
                                           field, inside_root, read_json_rows)
from data_pipelines.readers.mindcube import read_mindcube

OUTPUT_3D = "<output_3D>"
# Stage 1's PROMPT (task.py, appended to text_input) and stage 2's question template
# ("{Question}" + this), the "begin" variant both stages and the evaluation use.
INSTRUCTION = (
    "\nFirst imagine the mental 3D scene, think about the reasoning process in the mind and "
    "then provide the user with the answer. The reasoning process and answer are enclosed "
    "within <think> </think> and <answer> </answer> tags, respectively. Special tokens should "
    "be used to represent mental 3D scene at the beginning of your response, i.e., mental 3D "
    "scene here <think> reasoning process here </think><answer> answer here </answer>.")
SYSTEM = "You are a helpful assistant."   # Qwen2.5-VL's chat template without a system turn
FRAME_WIDTH, FRAME_HEIGHT = 480, 640      # PIL size (480, 640): 480 wide, 640 tall
OPTION_LETTERS = "ABCDE"                  # the public answer rule reads A-E
_ANSWER = re.compile(r"\s*\(?([A-Z])[.)](?:\s|$)")


class Thinker3DFormatError(BenchmarkFormatError):
  """A training row that does not follow the published format."""

  def __init__(self, path, row: int, idx, field_name: str, problem: str):
    super().__init__(path, row, idx, field_name, problem)
    self.args = (f"{path}: row {row} (idx {idx!r}), field {field_name!r}: {problem}",)

  def __str__(self) -> str:
    return self.args[0]


class MissingFrameError(MissingImageError):
  """A frame a row names is not on disk."""

  def __init__(self, path, row: int, idx, image: str, field_name: str = "image_input"):
    super().__init__(path, row, idx, image)
    self.field_name = field_name
    self.args = (f"{path}: row {row} (idx {idx!r}), field {field_name!r}: image not found: "
                 f"{image}",)

  def __reduce__(self):
    return type(self), (self.path, self.row, self.record_id, self.image, self.field_name)

  def __str__(self) -> str:
    return self.args[0]


class MissingFeaturesError(errors.MissingInputError):
  """A row's VGGT feature file is not in the cache."""

  def __init__(self, idx, feature_path, source: str = ""):
    self.idx, self.feature_path = idx, str(feature_path)
    where = f" ({source})" if source else ""
    super().__init__(f"VGGT feature file for idx {idx} not found: {feature_path}{where}; "
                     "the features come from 3DThinker's preprocessing/feature/"
                     "extract_vggt_feature.py (--config.data.features is the folder holding "
                     "feature_vggt/)")

  def __reduce__(self):
    return type(self), (self.idx, self.feature_path)


@dataclasses.dataclass(frozen=True)
class Thinker3DRow:
  """One question: its frames (paths under the image root), the question text, the stage-1
  target (None for evaluation questions), the option index of the answer and its key."""
  key: str                      # training: the idx; evaluation: the question id
  question: str
  images: tuple[str, ...]
  answer_choice: int
  target: str | None = None
  idx: int | str | None = None  # the feature cache's key (training rows)
  setting: str = ""             # MindCube's setting (among, around, rotation)
  row: int = 0                  # 1-based row in the file
  source: str = ""              # the file


def prompt_text(question: str) -> str:
  """The user turn's text after the frames."""
  return question + INSTRUCTION


def answer_choice(text: str) -> int | None:
  """The option index of an "X. option" answer (A -> 0), None when it does not start with
  an option letter A-E."""
  match = _ANSWER.match(text)
  if match is None or match.group(1) not in OPTION_LETTERS:
    return None
  return OPTION_LETTERS.index(match.group(1))


def _check_path(path, row: int, idx, name: str, value, image_root, check: bool) -> str:
  try:
    full = inside_root(path, row, idx, name, value, image_root)
  except BenchmarkFormatError as error:
    raise Thinker3DFormatError(path, row, idx, name, error.problem) from None
  if check:
    try:
      found = pathlib.Path(full).is_file()
    except (OSError, ValueError) as error:
      raise Thinker3DFormatError(path, row, idx, name, f"cannot look up {full[:80]!r}: "
                                 f"{getattr(error, 'strerror', None) or error}") from None
    if not found:
      raise MissingFrameError(path, row, idx, full, name)
  return full


def read_training_rows(path, image_root, check_images: bool = True) -> list[Thinker3DRow]:
  """Every row of a 3DThinker training JSONL; frames resolved under `image_root` (and found
  on disk with `check_images`). Rows must have distinct idx values."""
  rows, seen = [], {}
  for number, record in read_json_rows(path):
    if "idx" not in record:
      raise Thinker3DFormatError(path, number, None, "idx", "missing")
    idx = record["idx"]
    if isinstance(idx, bool) or not (isinstance(idx, int) and idx >= 0 or isinstance(idx, str)
                                     and re.fullmatch(r"[A-Za-z0-9_.-]+", idx)
                                     and idx not in (".", "..")):
      raise Thinker3DFormatError(path, number, idx, "idx", "expected an int >= 0 or a name "
                                 f"of letters, digits, '_', '.', '-', got {idx!r:.80}")
    if str(idx) in seen:
      raise Thinker3DFormatError(path, number, idx, "idx", f"repeats the idx of row "
                                 f"{seen[str(idx)]}")
    seen[str(idx)] = number
    get = lambda name, kind: _field(path, number, record, name, kind, idx)
    question, target = get("text_input", str), get("text_output", str)
    answer, images = get("answer", str), get("image_input", list)
    if not question.strip():
      raise Thinker3DFormatError(path, number, idx, "text_input", "empty")
    if target.count(OUTPUT_3D) != 1 or target.lstrip().find(OUTPUT_3D) != 0:
      raise Thinker3DFormatError(path, number, idx, "text_output", f"expected one "
                                 f"{OUTPUT_3D} placeholder at the start, got {target[:60]!r}")
    choice = answer_choice(answer)
    if choice is None:
      raise Thinker3DFormatError(path, number, idx, "answer", "expected an option letter "
                                 f"A-E then '.' (\"B. text\"), got {answer[:60]!r}")
    if not images or not all(isinstance(i, str) for i in images):
      raise Thinker3DFormatError(path, number, idx, "image_input",
                                 "expected a non-empty list of paths")
    frames = tuple(_check_path(path, number, idx, f"image_input[{k}]", image, image_root,
                               check_images) for k, image in enumerate(images))
    rows.append(Thinker3DRow(key=str(idx), question=question, images=frames,
                             answer_choice=choice, target=target, idx=idx, row=number,
                             source=str(path)))
  if not rows:
    raise Thinker3DFormatError(path, 0, None, "<file>", "no rows")
  return rows


def _field(path, row, record, name, kind, idx):
  try:
    return field(path, row, record, name, kind, idx)
  except BenchmarkFormatError as error:
    raise Thinker3DFormatError(path, row, idx, name, error.problem) from None


def read_eval_rows(path, image_root, check_images: bool = True,
                   limit: int = 0) -> list[Thinker3DRow]:
  """MindCube(-Tiny) questions (`readers.mindcube`: id, category, type, meta_info, question,
  images, gt_answer) as rows without targets: the first `limit` (0: all), whose images
  must be on disk with `check_images` (MissingImageError naming file, row, id, field, path)."""
  questions = read_mindcube(path, image_root=image_root, check_images=False)
  numbers = [number for number, _ in read_json_rows(path)]  # one question per row
  if limit:
    questions = questions[:limit]
  rows = []
  for question, number in zip(questions, numbers):
    if check_images:
      for k, image in enumerate(question.images):
        check_file(path, number, question.question_id, f"images[{k}]", image)
    choice = OPTION_LETTERS.find(question.answer)
    if choice < 0:
      raise BenchmarkFormatError(path, number, question.question_id, "gt_answer",
                                 f"expected a letter A-E, got {question.answer!r}")
    rows.append(Thinker3DRow(key=question.question_id, question=question.question,
                             images=question.images, answer_choice=choice,
                             setting=question.category, row=number, source=str(path)))
  if not rows:
    raise BenchmarkFormatError(path, 0, None, "<file>", "no questions")
  return rows


def feature_root(folder) -> pathlib.Path:
  """The cache root of `folder`: the folder holding `feature_vggt/` (the public layout's
  `data/`), or `feature_vggt/` itself."""
  folder = pathlib.Path(folder)
  if not (folder / "feature_vggt").is_dir() and folder.name == "feature_vggt":
    return folder.parent
  return folder


def check_features(rows: list[Thinker3DRow], folder) -> None:
  """Every row's feature file exists (MissingFeaturesError naming the first missing idx)."""
  root = feature_root(folder)
  for row in rows:
    path = caches.vggt_feature_path(root, row.idx)
    if not path.is_file():
      raise MissingFeaturesError(row.idx, path, f"row {row.row} of {row.source}")


def load_features(row: Thinker3DRow, folder, tokens: int, channels: int) -> np.ndarray:
  """float32 [K, tokens, channels]: the row's VGGT features, one block per frame."""
  root = feature_root(folder)
  path = caches.vggt_feature_path(root, row.idx)
  if not path.is_file():
    raise MissingFeaturesError(row.idx, path, f"row {row.row} of {row.source}")
  feature = caches.read_vggt_features(root, row.idx, tokens, channels)
  if feature.shape[0] != len(row.images):
    raise caches.CacheFormatError(
        f"{path}: key 'feature' holds {feature.shape[0]} frames; row {row.row} (idx "
        f"{row.idx!r}) of {row.source} has {len(row.images)} images")
  return feature


def load_frames(paths, width: int = FRAME_WIDTH, height: int = FRAME_HEIGHT) -> np.ndarray:
  """uint8 [K, height, width, 3]: the frames as RGB, each resized with PIL's LANCZOS to
  (width, height) unless it has that size (the public feature script's resize)."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  frames = []
  for path in paths:
    try:
      with Image.open(path) as image:
        image = image.convert("RGB")
        if image.size != (width, height):
          image = image.resize((width, height), Image.Resampling.LANCZOS)
        frames.append(np.asarray(image, np.uint8))
    except FileNotFoundError:
      raise FileNotFoundError(f"image not found: {path}") from None
    except OSError as error:
      raise OSError(f"{path}: not a readable image ({error})") from None
  return np.stack(frames)


def group_by_views(rows: list[Thinker3DRow]) -> dict[int, list[int]]:
  """{K: positions of the rows with K frames}, K ascending: each group is one shape."""
  groups: dict[int, list[int]] = {}
  for position, row in enumerate(rows):
    groups.setdefault(len(row.images), []).append(position)
  return dict(sorted(groups.items()))
