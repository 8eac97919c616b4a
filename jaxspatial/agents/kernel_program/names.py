"""The names the model's code sees: the preloaded ones, where a host tool lives, its error."""

PRELOADED = ("InputImages", "Metadata", "np", "numpy", "scipy", "math", "PIL", "tools",
             "vlm", "show", "ReturnAnswer")
# Host tools whose dotted name starts with one of these live at the top level of the
# namespace (`vlm.locate`, as the paper names them); every other name lives under `tools`
# (`Reconstruct` as tools.Reconstruct, `SAM3.video` as tools.SAM3.video).
TOP_LEVEL = ("vlm",)


def kernel_path(name: str) -> str:
  """How the model's code reaches host tool `name`: "vlm.locate" as vlm.locate,
  "SAM3.video" as tools.SAM3.video."""
  return name if name.partition(".")[0] in TOP_LEVEL else f"tools.{name}"


class ToolError(Exception):
  """A host tool failed; the message names the tool and the cause. (Not jaxspatial.errors'
  ToolError: the sandbox has no jaxspatial to import it from.)"""
