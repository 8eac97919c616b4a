"""Pure, jit- and vmap-able environments: reset(key, task, params), step(key, state, action, params)."""

from jaxspatial.envs import act3d
from jaxspatial.envs.act3d import Act3DAction, Act3DObservation, Act3DParams, Act3DState
from jaxspatial.envs.task import Task

__all__ = ["Act3DAction", "Act3DObservation", "Act3DParams", "Act3DState", "Task", "act3d"]
