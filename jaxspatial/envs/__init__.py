"""Pure, jit- and vmap-able environments: reset(key, task, params), step(key, state, action, params)."""

from jaxspatial.envs import act3d, image_tools, think3d
from jaxspatial.envs.act3d import Act3DAction, Act3DObservation, Act3DParams, Act3DState
from jaxspatial.envs.task import Task, decode_text
from jaxspatial.envs.think3d import (Think3DAction, Think3DObservation, Think3DParams,
                                     Think3DState)

__all__ = ["Act3DAction", "Act3DObservation", "Act3DParams", "Act3DState", "Task",
           "Think3DAction", "Think3DObservation", "Think3DParams", "Think3DState", "act3d", "image_tools",
           "decode_text", "think3d"]
