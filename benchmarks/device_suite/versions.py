"""The versions part: jax / jaxlib / flax, CUDA and cuDNN where discoverable, the devices,
the host."""

from __future__ import annotations

import os
import platform

import flax
import jax
import jaxlib
import numpy as np

from jaxspatial import xla_workarounds


def versions_part(entry: dict) -> None:
  devices = jax.devices()
  entry.update(jax=jax.__version__, jaxlib=jaxlib.__version__, flax=flax.__version__,
               numpy=np.__version__, python=platform.python_version(),
               platform=devices[0].platform, device_kind=devices[0].device_kind,
               device_count=len(devices), process_count=jax.process_count(),
               host_cpus=os.cpu_count(), host_machine=platform.machine(),
               xla_flags=os.environ.get("XLA_FLAGS", ""))
  try:
    import open3d  # pylint: disable=import-outside-toplevel
    entry["open3d"] = open3d.__version__
  except Exception as exc:  # pylint: disable=broad-except
    entry["open3d"] = f"unavailable: {type(exc).__name__}: {exc}"[:300]
  try:
    from jax.extend import backend  # pylint: disable=import-outside-toplevel
    entry["backend_platform_version"] = backend.get_backend().platform_version
  except Exception as exc:  # pylint: disable=broad-except
    entry["backend_platform_version"] = f"unavailable: {exc}"[:300]
  # jax._src.lib.cuda_versions is private and absent without the CUDA plugin.
  cuda = {}
  try:
    from jax._src.lib import cuda_versions  # pylint: disable=import-outside-toplevel
    names = dir(cuda_versions) if cuda_versions is not None else []
    for name in names:
      if name.endswith("version") and callable(getattr(cuda_versions, name)):
        try:
          cuda[name] = getattr(cuda_versions, name)()
        except Exception as exc:  # pylint: disable=broad-except
          cuda[name] = f"unavailable: {exc}"[:200]
  except Exception as exc:  # pylint: disable=broad-except
    cuda["error"] = f"{type(exc).__name__}: {exc}"[:300]
  entry["cuda_versions"] = cuda
  try:
    entry["environment_info"] = jax.print_environment_info(return_string=True)
  except Exception as exc:  # pylint: disable=broad-except
    entry["environment_info"] = f"unavailable: {exc}"[:300]
  entry["scatter_regression_affected"] = xla_workarounds.scatter_add_affected(
      jaxlib.__version__, devices[0].platform == "gpu")
