"""The launch tools' one entry: absl flags, with a config mistake reported in one line.

`run(main)` is `absl.app.run(main)` whose flag parsing turns what ml_collections reports as
a 40-line traceback (a config file that does not exist or does not load, an override of a
key the config does not have, a value of the wrong type) into one line naming the flag,
the config file and the nearest valid keys; `--help` prints the usage and exits 0.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from jaxspatial.errors import WorkdirInUseError

HELP = ("--help", "-h", "--helpshort", "--helpfull", "-?")


def _override(argv: list[str], prefix: str) -> list[tuple[str, str]]:
  """(flag, dotted key) of each `--<prefix>.key[=value]` argument."""
  out = []
  for arg in argv[1:]:
    if arg.startswith(f"--{prefix}."):
      flag = arg.split("=", 1)[0]
      out.append((flag, flag[len(prefix) + 3:]))
  return out


def _config_path(argv: list[str], name: str, default: str | None) -> str | None:
  for k, arg in enumerate(argv[1:], 1):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and k + 1 < len(argv):
      return argv[k + 1]
  return default


def _load(path: str):
  """The config file's `get_config(variant)`, or None when it cannot be loaded."""
  file, _, variant = path.partition(":")
  if not os.path.isfile(file):
    return None
  spec = importlib.util.spec_from_file_location("_cli_config", file)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    return module.get_config(variant) if variant else module.get_config()
  except Exception:  # pylint: disable=broad-except
    return None


def unknown_key(config, key: str) -> str | None:
  """Why `key` (dotted) is not in `config`, with the nearest valid keys; None if it is."""
  node, walked = config, []
  for part in key.split("."):
    keys = list(node.keys()) if hasattr(node, "keys") else None
    if keys is None:
      return f"{'.'.join(walked)} is a value ({type(node).__name__}), not a group of keys"
    if part not in keys:
      near = difflib.get_close_matches(part, [str(k) for k in keys], n=3, cutoff=0.5)
      where = ".".join(walked) or "the config"
      hint = (f"did you mean {', '.join('.'.join(walked + [n]) for n in near)}?" if near
              else f"its keys: {', '.join(sorted(map(str, keys))[:12])}")
      return f"{where} has no key {part!r}; {hint}"
    node = node[part]
    walked.append(part)
  return None


def explain(argv: list[str], name: str, default: str | None, error: BaseException) -> str:
  """One line for a failure of config flag `name` (default file `default`)."""
  path = _config_path(argv, name, default)
  if path is not None:
    file = path.partition(":")[0]
    if not os.path.isfile(file):
      return f"--{name} {path}: no such config file (the configs are in configs/*.py)"
    config = _load(path)
    for arg, key in _override(argv, name) if config is not None else ():
      problem = unknown_key(config, key)
      if problem:
        return f"{arg}: {file}: {problem}"
  return one_line(error)


def one_line(error: BaseException) -> str:
  """The first and last lines of an error whose message holds a traceback."""
  lines = [line for line in str(error).strip().splitlines() if line.strip()]
  if not lines:
    return type(error).__name__
  return lines[0] if len(lines) == 1 else f"{lines[0].rstrip(':')}: {lines[-1].strip()}"


def _tool() -> str:
  return os.path.basename(sys.argv[0]).removesuffix(".py")


def config_flag(name: str, default: str | None, help_: str):
  """`config_flags.DEFINE_config_file`, whose mistakes (it parses the default and the
  command line's overrides at once) exit with one line."""
  try:
    return config_flags.DEFINE_config_file(name, default, help_)
  except Exception as error:  # pylint: disable=broad-except
    sys.exit(f"{_tool()}: {explain(sys.argv, name, default, error)}")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing with a one-line error for config mistakes; --help exits 0."""
  if any(arg in HELP for arg in argv[1:]):
    app.usage(shorthelp="--helpfull" not in argv, writeto_stdout=True, exitcode=0)
  configs = {name: flag for name, flag in flags.FLAGS._flags().items()  # pylint: disable=protected-access
             if type(flag).__name__ == "_ConfigFlag"}
  try:
    rest = flags.FLAGS(argv)
    for flag in configs.values():
      flag.value.keys()  # a config that failed to load raises on first use: here
  except flags.Error as error:
    sys.exit(f"{_tool()}: {one_line(error)}")
  except Exception as error:  # pylint: disable=broad-except
    lines = [explain(argv, name, flag.default_as_str.strip("'\"") or None, error)
             for name, flag in configs.items()]
    sys.exit(f"{_tool()}: {next((l for l in lines if l != one_line(error)), one_line(error))}")
  return rest


def run(main) -> None:
  """`app.run(main)` with `parse_flags`; a work directory another run holds is one line."""

  def guarded(argv):
    try:
      return main(argv)
    except WorkdirInUseError as error:
      sys.exit(f"{_tool()}: {error}")

  app.run(guarded, flags_parser=parse_flags)


def define_flags(options_class) -> None:
  """One absl flag per field of a dataclass whose fields carry `help` (and optionally
  `choices`, `kind`: the type when the default is None) in their metadata."""
  define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}
  for field in dataclasses.fields(options_class):
    meta = field.metadata
    if meta.get("choices"):
      flags.DEFINE_enum(field.name, field.default, meta["choices"], meta["help"])
    else:
      kind = meta.get("kind") or type(field.default)
      define.get(kind, flags.DEFINE_string)(field.name, field.default, meta["help"])


def flag_values(options_class):
  """The dataclass of `define_flags`' flags as parsed."""
  return options_class(**{field.name: flags.FLAGS[field.name].value
                          for field in dataclasses.fields(options_class)})
