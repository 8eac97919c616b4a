r"""PERIA's twelve perception tools by their public names: `TOOLS`, one registry for the
host, the compiled rollout and the HTTP server.

    tool = TOOLS["text_segment"].bind("/models/sam3")    # or $JAXSPATIAL_SAM3_MODEL
    tool(image_HxWx3, text_prompt="chair")       -> {"image_size": [H, W], "proposals": ...}
    tool.text(image_HxWx3, text_prompt="chair")  -> "Tool executed successfully.\nResult: {...}"
    tool.host_tool(tokenizer, max_tokens)        -> a TextTool for the compiled rollout

Families (`FAMILIES`): "ocr" (text_ocr, formula_ocr, table_ocr, text_spotting,
map_text_ocr; ocr.py) runs PP-OCRv4 from the rapidocr wheel by default, one backend per
process, or a bound PaddleOCR-VL folder (PERIA's OCR model); "sam3" (auto_segment,
bbox_segment, text_segment, exemplar_segment, concept_count, presence_check;
segmentation.py) and "grounding_dino" (detection.py) need a Hugging Face model folder:
`bind(folder)` or the family's environment variable (`MODEL_ENV`). Without one, a call
raises `ModelFolderError` naming the tool, the family and every way to give the folder. A
folder's backend is loaded on first use, once per process (per folder and load options),
and shared by the family's tools.

Arguments are the public ones (`PerceptionTool.arguments`) as the model wrote them;
`image_index` is the caller's (it picked the image) and its value is ignored here. The
tools' own code answers (ocr.run_tool, SAM3Backend.run_tool, GroundingDinoBackend.run_tool):
a bad model-written argument never raises; `text` is then PERIA's "Error executing {tool}:
..." and `__call__` returns {"error": that text}. The caller's mistakes raise (an image
not [H, W, 3] uint8, no model folder, a folder that does not load).

Inside jit a tool is a `TextTool` (`host_tool`), called as `fn(image, bounding_box or
None, **text)`: PERIA's grammar writes `image_index` and either an optional
`bounding_box` or a text argument (`text_prompt` or `question`), passed as that keyword,
so a tool given a key it does not take answers with its unexpected-argument error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any, Callable

from jaxspatial.errors import ModelFolderError
from jaxspatial.perception import detection, ocr, paddleocr_vl, segmentation
from jaxspatial.perception.host_tool import TextTool
from jaxspatial.perception.tool_args import SUCCESS

FAMILIES: dict[str, tuple[str, ...]] = {
    "ocr": tuple(ocr.TOOLS),
    "sam3": tuple(segmentation.SAM3_TOOLS),
    "grounding_dino": ("grounding_dino",),
}
MODEL_ENV = {family: f"JAXSPATIAL_{family.upper()}_MODEL" for family in FAMILIES}
_CHECKPOINT = {"ocr": "PaddleOCR-VL", "sam3": "SAM 3", "grounding_dino": "GroundingDINO"}
_LOADERS: dict[str, Callable] = {
    "ocr": paddleocr_vl.PaddleOCRVLBackend.from_pretrained,
    "sam3": segmentation.SAM3Backend.from_pretrained,
    "grounding_dino": detection.GroundingDinoBackend.from_pretrained,
}


def _run_ocr(name, image, arguments, backend) -> str:
  return ocr.run_tool(name, image, arguments, backend)


def _run_method(name, image, arguments, backend) -> str:
  return backend.run_tool(name, image, arguments)


_RUN = {"ocr": _run_ocr, "sam3": _run_method, "grounding_dino": _run_method}

# Backends shared by the process: one RapidOCR engine, one model per folder and options.
_LOCK = threading.Lock()
_DEFAULT_OCR: list = []
_LOADED: dict[tuple, Any] = {}


def default_ocr_backend() -> ocr.RapidOCRBackend:
  """The process's PP-OCRv4 backend (its engine is built on first read)."""
  with _LOCK:
    if not _DEFAULT_OCR:
      _DEFAULT_OCR.append(ocr.RapidOCRBackend())
    return _DEFAULT_OCR[0]


def _missing_folder(tool: str, family: str) -> ModelFolderError:
  hint = "/path/to/folder"
  return ModelFolderError(
      f"{tool} (family {family!r}) needs a {_CHECKPOINT[family]} model folder and has none: "
      f"bind one (TOOLS[{tool!r}].bind({hint!r})), set ${MODEL_ENV[family]}, pass --models "
      f"{family}={hint} to launch.perception_server, or in a recipe set "
      f"--config.perception.models.{family}={hint} (or serve the tools and set "
      "--config.perception.url)")


def load_backend(family: str, folder, **options):
  """The backend of `family` from a model folder, loaded once per process per (folder,
  options); `options` go to its from_pretrained (device, dtype, config)."""
  if family not in _LOADERS:
    raise ValueError(f"unknown perception family {family!r}; expected one of {list(FAMILIES)}")
  key = (family, os.path.abspath(os.fspath(folder)), tuple(sorted(options.items())))
  with _LOCK:  # held while loading: two threads never load the same model twice
    if key not in _LOADED:
      try:
        _LOADED[key] = _LOADERS[family](key[1], **options)
      except (OSError, ValueError) as error:
        raise ModelFolderError(f"family {family!r}: the {_CHECKPOINT[family]} folder "
                               f"{key[1]} does not load: {error}") from error
    return _LOADED[key]


@dataclasses.dataclass(frozen=True)
class PerceptionTool:
  """One public perception tool: `name`, `family`, its public `arguments` (image_index
  first) and what it runs on (`source`: None, a model folder, or a backend object)."""
  name: str
  family: str
  arguments: tuple[str, ...]
  source: Any = None
  options: tuple = ()  # from_pretrained options of a folder source, as sorted items

  def bind(self, source, **options) -> "PerceptionTool":
    """This tool on `source`: a model folder (loaded on first use with `options`, e.g.
    device="cuda", dtype="bfloat16", config=SegmentationConfig(...)) or a backend object
    (an OCR backend for "ocr", SAM3Backend, GroundingDinoBackend)."""
    is_folder = isinstance(source, (str, os.PathLike))
    if source is None or (is_folder and not os.fspath(source)):
      raise ValueError(f"{self.name}.bind: expected a model folder or a backend, got "
                       f"{source!r}")
    if options and not is_folder:
      raise ValueError(f"{self.name}.bind: options {sorted(options)} are loading options "
                       "for a folder; a backend object comes configured")
    return dataclasses.replace(self, source=source, options=tuple(sorted(options.items())))

  def backend(self):
    """The backend this tool runs on, loaded now if it is not yet; ModelFolderError when
    the family needs a folder and none is bound or in its environment variable."""
    if self.source is not None and not isinstance(self.source, (str, os.PathLike)):
      return self.source
    folder = os.fspath(self.source) if self.source is not None else os.environ.get(
        MODEL_ENV[self.family], "")
    if folder:
      return load_backend(self.family, folder, **dict(self.options))
    if self.family == "ocr":
      return default_ocr_backend()
    raise _missing_folder(self.name, self.family)

  def text(self, image_HxWx3, **arguments) -> str:
    """The observation text the agent sees for this call."""
    return _RUN[self.family](self.name, image_HxWx3, arguments, self.backend())

  def __call__(self, image_HxWx3, **arguments) -> dict:
    """The call's JSON result as a dict; {"error": the error text} for a bad argument."""
    return parse_result(self.text(image_HxWx3, **arguments))

  def text_fn(self) -> Callable[..., str]:
    """`fn(image, bounding_box=None, **arguments) -> str`, the form TextTool and ToolServer
    call (a None box is no box). The backend is resolved now, so a missing folder fails
    when the tool is built, not as error text in every observation."""
    backend, run, name = self.backend(), _RUN[self.family], self.name

    def tool(image_HxWx3, bounding_box=None, **arguments) -> str:
      if bounding_box is not None:
        arguments["bounding_box"] = bounding_box
      return run(name, image_HxWx3, arguments, backend)

    tool.__name__ = tool.__qualname__ = name
    return tool

  @property
  def optional(self) -> tuple[str, ...]:
    """The arguments a call may leave out (image_index is always written): the OCR tools'
    bounding_box (without it they read the whole image)."""
    return ("bounding_box",) if self.family == "ocr" else ()

  def host_tool(self, tokenizer, max_tokens: int = 256, **options) -> TextTool:
    """This tool as a TextTool for the compiled rollout, described by its public
    arguments; `options` go to TextTool (timeout_s, retries, on_error)."""
    return TextTool(self.name, self.text_fn(), tokenizer, max_tokens, arguments=self.arguments,
                    optional=self.optional, **options)


def parse_result(text: str) -> dict:
  """An observation text as the dict the agent reads: the JSON after "Result: ", or
  {"error": text} for an error observation."""
  if text.startswith(SUCCESS):
    return json.loads(text[len(SUCCESS):])
  return {"error": text}


def _arguments(family: str, name: str) -> tuple[str, ...]:
  if family == "ocr":
    return tuple(ocr.ARGUMENTS)
  if family == "sam3":
    return tuple(segmentation.TOOL_ARGUMENTS[name])
  return tuple(detection.TOOL_ARGUMENTS)


TOOLS: dict[str, PerceptionTool] = {
    name: PerceptionTool(name, family, _arguments(family, name))
    for family, names in FAMILIES.items() for name in names}


def select(names, models: dict | None = None) -> dict[str, PerceptionTool]:
  """{tool name: tool} for `names`, each a public tool name or a family (all its tools),
  in order; `models` {family: folder} binds the families given a non-empty folder. An
  unknown name or family, or a tool named twice, is a ValueError."""
  models = {k: v for k, v in dict(models or {}).items() if v}
  unknown = sorted(set(models) - set(FAMILIES))
  if unknown:
    raise ValueError(f"model folders for unknown families {unknown}; families: "
                     f"{list(FAMILIES)}")
  out: dict[str, PerceptionTool] = {}
  for entry in names:
    if entry not in FAMILIES and entry not in TOOLS:
      raise ValueError(f"unknown perception tool or family {entry!r}; families: "
                       f"{list(FAMILIES)}; tools: {list(TOOLS)}")
    for name in FAMILIES.get(entry, (entry,)):
      if name in out:
        raise ValueError(f"perception tool {name!r} is named twice in {list(names)}")
      tool = TOOLS[name]
      out[name] = tool.bind(models[tool.family]) if tool.family in models else tool
  return out
