"""The launch tools' one entry: absl flags, with a user's mistake reported in one line.

`run(main)` is `absl.app.run(main)` whose flag parsing turns what ml_collections reports as
a 40-line traceback (a config file that does not exist or does not load, an override of a
key the config does not have, a value of the wrong type) into one line naming the flag,
the config file and the nearest valid keys; `--help` prints the tool's flags (those that
`config_flag` and `define_flags` define included) and exits 0. What `main` raises about
the user's input (`user_error`: a usage error, a missing file, folder or checkpoint) is one
line on stderr and exit status 1; a bug keeps its traceback, and so does every error with
JAXSPATIAL_DEBUG=1 in the environment. `tfds_build` puts one line of ours in place of
TFDS's "Downloading and preparing dataset Unknown size ..." for a local build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.util
import linecache
import logging as std_logging
import os
import pathlib
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from jaxspatial.errors import JaxspatialError, MissingInputError

HELP = ("--help", "-h", "--helpshort", "--helpfull", "-?")
DEBUG = "JAXSPATIAL_DEBUG"  # set (not "" or "0"): errors keep their traceback
# One of these raised by the project's own code (a ValueError: by its `raise` statement)
# reports the user's input; raised inside a library (numpy, JAX, TFDS), or a ValueError of
# a builtin (max([]), int("x")) in our code, it is a bug to trace.
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
               IsADirectoryError, PermissionError)
_ROOT = pathlib.Path(__file__).resolve().parents[1]
_OURS = ("configs", "data_pipelines", "jaxspatial", "launch", "recipes")

# config_flag and define_flags define flags for the tool that calls them: absl attributes
# them to it, so its --help lists them.
flags.disclaim_key_flags()


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
  """(the config file's `get_config(variant)`, None) or (None, why it does not load)."""
  file, _, variant = path.partition(":")
  spec = importlib.util.spec_from_file_location("_cli_config", file)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
      return None, "it defines no get_config() (configs/*.py with one are the configs)"
    return (module.get_config(variant) if variant else module.get_config()), None
  except Exception as error:  # pylint: disable=broad-except
    return None, f"it does not load: {type(error).__name__}: {one_line(error)}"


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
    config, why = _load(path)
    if config is None:
      return f"--{name} {path}: {why}"
    for arg, key in _override(argv, name):
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


def _default(flag) -> str | None:
  """A config flag's default file."""
  return flag.default_as_str.strip("'\"") or None


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
    app.usage(shorthelp="--helpfull" not in argv, writeto_stdout=True)
    print(f"\nA mistake in the input is one line on stderr; {DEBUG}=1 shows its traceback.")
    sys.exit(0)
  configs = {name: flag for name, flag in flags.FLAGS._flags().items()  # pylint: disable=protected-access
             if type(flag).__name__ == "_ConfigFlag"}
  try:
    rest = flags.FLAGS(argv)
    for flag in configs.values():
      flag.value.keys()  # a config that failed to load raises on first use: here
  except Exception as error:  # pylint: disable=broad-except
    lines = [explain(argv, name, _default(flag), error)
             for name, flag in configs.items()]
    sys.exit(f"{_tool()}: {next((l for l in lines if l != one_line(error)), one_line(error))}")
  return rest


def user_error(error: BaseException) -> bool:
  """Whether `error` reports the user's input rather than a bug: a usage error, any
  JaxspatialError, or one of USER_ERRORS raised by the project's own code."""
  if isinstance(error, (app.UsageError, JaxspatialError)):
    return True
  if not isinstance(error, USER_ERRORS):
    return False
  frame, where, line = error.__traceback__, None, 0
  while frame is not None:
    where, line, frame = frame.tb_frame.f_code.co_filename, frame.tb_lineno, frame.tb_next
  try:
    ours = pathlib.Path(where).resolve().relative_to(_ROOT).parts[0] in _OURS
  except (TypeError, ValueError):  # no traceback, or a file outside the checkout
    return False
  return ours and (not isinstance(error, ValueError)
                   or linecache.getline(where, line).lstrip().startswith("raise"))


def run(main) -> None:
  """`app.run(main)` with `parse_flags`; a `user_error` that main raises is one line on
  stderr (the message names the fix) and exit status 1, without its traceback unless
  JAXSPATIAL_DEBUG is set."""
  debug = os.environ.get(DEBUG, "0") not in ("", "0")

  def guarded(argv):
    if not debug:
      logging.get_absl_logger().addFilter(_quiet_tfds)
    try:
      return main(argv)
    except Exception as error:  # pylint: disable=broad-except
      if debug or not user_error(error):
        raise
      sys.exit(f"{_tool()}: {str(error).strip() or type(error).__name__}")

  app.run(guarded, flags_parser=parse_flags)


def _quiet_tfds(record) -> bool:
  """TFDS's INFO and WARNING lines are about its download and variant bookkeeping (e.g.
  "Variant folder ... has no dataset_info.json" before we say the data is not prepared),
  which our local builds and reads do not use."""
  return record.levelno >= std_logging.ERROR or "tensorflow_datasets" not in record.pathname


def need_folder(path: str, flag: str, fix: str) -> str:
  """`path` when it is a folder, else a MissingInputError `--flag PATH: no such folder;
  FIX` (checked before the tool loads anything). A remote path (gs://...) is the
  reader's to check."""
  if "://" not in path and not os.path.isdir(path):
    raise MissingInputError(f"--{flag} {path}: no such folder; {fix}")
  return path


def need_run(checkpoint: str | None, config) -> str | None:
  """The work directory of the run a tool reads (`--checkpoint`, default the config's
  workdir); a missing one says how to make it. None: neither gives one (the recipe's to
  report)."""
  workdir = checkpoint or config.get("workdir")
  if not workdir:
    return None
  train = [_config_path(sys.argv, "config", _default(flags.FLAGS["config"]))]
  train += [arg for arg in sys.argv[1:] if arg.startswith("--config.")]
  return need_folder(workdir, "checkpoint", "give a run's work directory (default: the "
                     "config's workdir), or train the run first: python -m launch.train "
                     f"--config {' '.join(train)}")


def need_policy(folder: str) -> str:
  """`folder` when it is one, else a MissingInputError saying what a policy folder is."""
  return need_folder(folder, "checkpoint", "give a Hugging Face policy folder (python -m "
                     "launch.export --out DIR writes one from a run)")


@contextlib.contextmanager
def tfds_build(source: str):
  """Within: a TFDS build announces itself in one line, `building <name>/<config> from
  <source> into <folder>`, in place of TFDS's "Downloading and preparing dataset Unknown
  size ..." (a local build downloads nothing and its size is unknown until written) and
  "... downloaded and prepared" lines; TFDS's INFO log is off. A prepared dataset that is
  reused prints nothing."""
  from tensorflow_datasets.core import dataset_builder  # pylint: disable=import-outside-toplevel

  def announce(builder) -> None:
    print(f"building {builder.name}/{builder.builder_config.name} from {source} into "
          f"{builder.data_dir}", flush=True)

  builder_class = dataset_builder.DatasetBuilder
  replaced = {"_log_download_bytes": announce, "_log_download_done": lambda builder: None}
  saved = {name: vars(builder_class)[name] for name in replaced if name in vars(builder_class)}
  verbosity = logging.get_verbosity()
  try:
    for name in saved:  # a TFDS without these methods keeps its own lines
      setattr(builder_class, name, replaced[name])
    logging.set_verbosity(logging.WARNING)
    yield
  finally:
    logging.set_verbosity(verbosity)
    for name, method in saved.items():
      setattr(builder_class, name, method)


def define_flags(options_class) -> None:
  """One absl flag per field of a dataclass whose fields carry `help` (and optionally
  `choices`, `kind`: the type when the default is None) in their metadata. absl shows no
  default None: a help text that names no default says "(default: none)"."""
  define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}
  for field in dataclasses.fields(options_class):
    meta = field.metadata
    help_ = meta["help"]
    if field.default is None and "default" not in help_:
      help_ = f"{help_} (default: none)"
    if meta.get("choices"):
      flags.DEFINE_enum(field.name, field.default, meta["choices"], help_)
    else:
      kind = meta.get("kind") or type(field.default)
      define.get(kind, flags.DEFINE_string)(field.name, field.default, help_)


def flag_values(options_class):
  """The dataclass of `define_flags`' flags as parsed."""
  return options_class(**{field.name: flags.FLAGS[field.name].value
                          for field in dataclasses.fields(options_class)})
