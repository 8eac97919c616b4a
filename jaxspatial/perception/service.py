"""Perception tools as an HTTP service: a tool runs in one process, rollouts call it remotely.

A host tool is a plain callable, numpy in and numpy out: `fn(*args, **arrays_and_args) ->
dict[str, np.ndarray]`, or `-> str` for a text tool (PERIA's OCR returns JSON text).
`server.ToolServer(tools)` serves a dict of them over HTTP in the `wire` format;
`client.RemoteTool(url, name)` is callable like the local tool, so `HostTool` / `TextTool`
take either.

This module is the registry the launch script serves from. `TOOL_FACTORIES` (family name ->
`factory(folder=None, names=None)` returning {tool name: callable} for `names`, default all
the family's) is what `launch/perception_server.py` serves from: "echo" and "empty"
(diagnostics, no model) and PERIA's perception families "ocr", "sam3", "grounding_dino"
from the registry (`jaxspatial.perception.tools`; a family's model folder goes to its
factory). `build_tools` takes families and public tool names alike.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from jaxspatial.perception import tools as perception_tools


def echo(*args, **kwargs) -> dict[str, Any]:
  """Diagnostic: returns its keyword inputs (arrays and strings; numbers and lists as
  arrays) and positional ones as arg0, arg1, ..."""
  values = {**{f"arg{i}": v for i, v in enumerate(args)}, **kwargs}
  return {k: v if isinstance(v, str) else np.asarray(v) for k, v in values.items()}


def empty(*args, **kwargs) -> dict[str, Any]:
  """Diagnostic: takes anything, returns nothing (the round trip's fixed cost)."""
  del args, kwargs
  return {}


def _no_model(family: str, tools: dict[str, Callable]) -> Callable:
  """A factory for a family that takes no model folder."""
  def factory(folder=None, names=None) -> dict[str, Callable]:
    if folder:
      raise ValueError(f"tool family {family!r} takes no model folder, got {folder!r}")
    return {n: fn for n, fn in tools.items() if names is None or n in names}
  return factory


def _registry_family(family: str, folder=None, names=None) -> dict[str, Callable]:
  """The family's tools (`names`, default all) of `jaxspatial.perception.TOOLS` as text
  functions (`text_fn`: `fn(image, bounding_box=None, **arguments) -> str`) on one
  backend: the folder's (loaded once), else the family's default (OCR: PP-OCRv4) or its
  environment variable; a family that needs a folder and has none is a ModelFolderError
  naming the first tool asked for."""
  chosen = perception_tools.select([family] if names is None else names,
                                   {family: folder} if folder else None)
  return {name: tool.text_fn() for name, tool in chosen.items()}


TOOL_FACTORIES: dict[str, Callable[..., dict[str, Callable]]] = {
    "echo": _no_model("echo", {"echo": echo}),
    "empty": _no_model("empty", {"empty": empty}),
    **{family: functools.partial(_registry_family, family)
       for family in perception_tools.FAMILIES},
}


def _family_of(name: str) -> str:
  """A family's own name, or the family of a public perception tool."""
  return name if name in TOOL_FACTORIES else perception_tools.TOOLS[name].family


def build_tools(names, models: dict | None = None) -> dict[str, Callable]:
  """The tools of `names`, each a `TOOL_FACTORIES` family (all its tools) or a public
  perception tool name (`jaxspatial.perception.TOOLS`); `models` {family: model folder}
  (empty folders are ignored). ValueError for an unknown name, a folder for a family not
  served, or a tool named twice; ModelFolderError (a ValueError) for a family whose folder
  is missing or does not load."""
  names = list(names)
  unknown = [n for n in names if n not in TOOL_FACTORIES and n not in perception_tools.TOOLS]
  if unknown:
    raise ValueError(f"unknown tool families or tools {unknown}; families: "
                     f"{sorted(TOOL_FACTORIES)}; tools: {sorted(perception_tools.TOOLS)}")
  models = {k: v for k, v in dict(models or {}).items() if v}
  strange = sorted(set(models) - set(TOOL_FACTORIES))
  if strange:
    raise ValueError(f"model folders for unknown families {strange}; families: "
                     f"{sorted(TOOL_FACTORIES)}")
  families = list(dict.fromkeys(_family_of(n) for n in names))
  unused = sorted(set(models) - set(families))
  if unused:
    raise ValueError(f"model folders given for {unused}, but no tool of "
                     f"{'that family' if len(unused) == 1 else 'those families'} is served "
                     f"(serving {names})")
  # Each family's factory runs once, for the tools asked of it (None: all of them).
  wanted = {f: None if f in names else list(dict.fromkeys(n for n in names
                                                         if _family_of(n) == f))
            for f in families}
  built = {f: TOOL_FACTORIES[f](models.get(f), wanted[f]) for f in families}
  tools: dict[str, Callable] = {}
  for name in names:
    family = _family_of(name)
    chosen = built[family] if name == family else {name: built[family][name]}
    for tool, fn in chosen.items():
      if tool in tools:
        raise ValueError(f"tool {tool!r} of family {family!r} is already served by another "
                         f"entry in {names}")
      tools[tool] = fn
  return tools
