"""jaxspatial's exceptions: one root, a few kinds, each class defined once.

Every error jaxspatial raises on purpose is a `JaxspatialError`, and also the builtin
its kind has always been, so `except ValueError` around a loader keeps working:

  JaxspatialError
  ├── InputError (ValueError)            what a user or a model gave is wrong; the
  │   │                                  message names the file, record, field and
  │   │                                  expected against got
  │   ├── ConfigError                    a config key or value
  │   ├── ModelFolderError               a Hugging Face / perception model folder
  │   ├── RecordError                    a dataset record (data_pipelines subclasses it)
  │   ├── ToolArgumentError              a tool call's arguments (host or kernel tools)
  │   ├── StepFormatError                a model turn that breaks the step format
  │   ├── WireError                      a perception request or reply off the wire format
  │   └── ResumeError                    a prediction log that does not match its run
  ├── MissingInputError (FileNotFoundError)  a file the input names is absent
  ├── CheckpointError (RuntimeError)     a training checkpoint could not be written or read
  │   ├── CheckpointCorruptError
  │   └── CheckpointMismatchError (ValueError)  the run's state has another structure
  ├── WorkdirInUseError (RuntimeError)   another live run holds the training work directory
  ├── ToolError (RuntimeError)           a perception tool failed while running
  ├── ServiceError (RuntimeError)        a service we call (judge endpoint, tool server)
  │   └── TransportError (OSError)       the connection dropped or timed out (retried)
  └── SandboxError (RuntimeError)        the code kernel's sandbox
      ├── SandboxUnavailable             bubblewrap is missing
      └── KernelStartError               the kernel did not start

`serving.APIError` (an OpenAI error reply with a status) is a `ServiceError` too. The
SpatialClaw kernel's in-sandbox `ToolError` is the name model-written code sees; it is
not a class of this package (the kernel program imports nothing of jaxspatial).
"""

__all__ = ["CheckpointCorruptError", "CheckpointError", "CheckpointMismatchError", "ConfigError",
           "InputError", "JaxspatialError", "KernelStartError", "MissingInputError",
           "ModelFolderError", "RecordError", "ResumeError", "SandboxError", "SandboxUnavailable",
           "ServiceError", "StepFormatError", "ToolArgumentError", "ToolError", "TransportError",
           "WireError", "WorkdirInUseError", "check_one_of"]


class JaxspatialError(Exception):
  """The root: every error jaxspatial raises on purpose."""


class InputError(JaxspatialError, ValueError):
  """Input a user or a model gave is wrong; the message says where and what."""


class ConfigError(InputError):
  """A config key that does not exist or a value out of its range."""


class ModelFolderError(InputError):
  """A model folder (Hugging Face checkpoint, perception weights) that cannot be used."""


class RecordError(InputError):
  """A dataset record that breaks its format (file, record id, field)."""


class ToolArgumentError(InputError):
  """A tool call's arguments are wrong; the tool did no work."""


class StepFormatError(InputError):
  """A model turn that breaks the step format its agent parses."""


class WireError(InputError):
  """A perception request or reply that breaks the wire format."""


class ResumeError(InputError):
  """A prediction log that belongs to another run."""


class MissingInputError(JaxspatialError, FileNotFoundError):
  """A file that the input names is absent."""


class CheckpointError(JaxspatialError, RuntimeError):
  """A training checkpoint step could not be written or restored."""


class CheckpointCorruptError(CheckpointError):
  """A checkpoint step is damaged (truncated, bit flips, missing files)."""


class CheckpointMismatchError(CheckpointError, ValueError):
  """A checkpoint holds state of another structure than the run's."""


class WorkdirInUseError(JaxspatialError, RuntimeError):
  """Another live run holds the work directory; the message names it (host, pid, start,
  command)."""


class ToolError(JaxspatialError, RuntimeError):
  """A perception tool failed while running; the message names the tool and the cause."""


class ServiceError(JaxspatialError, RuntimeError):
  """A service jaxspatial calls answered with an error."""


class TransportError(ServiceError, OSError):
  """No complete HTTP response: `kind` is "timeout", "refused", "disconnected",
  "connection", "protocol" or "oversize" (the first four are retried)."""

  def __init__(self, kind: str, message: str):
    super().__init__(message)
    self.kind = kind


class SandboxError(JaxspatialError, RuntimeError):
  """The code kernel's operating-system sandbox."""


class SandboxUnavailable(SandboxError):
  """bubblewrap is missing: the kernel refuses to run model-written code without it."""


class KernelStartError(SandboxError):
  """The kernel process did not start or did not answer its first message."""


def check_one_of(where: str, value, choices):
  """`value` if it is one of `choices`, else a ValueError naming `where`, the choices and
  what was given."""
  if value not in choices:
    raise ValueError(f"{where}: expected one of {tuple(choices)}, got {value!r}")
  return value
