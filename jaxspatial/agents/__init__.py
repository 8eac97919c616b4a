"""SpatialClaw's code-as-action agent: the model writes one Python cell per step; each cell
runs in a persistent, sandboxed kernel process per episode (kernel.py: the controller;
kernel_program/: the program inside; sandbox.py: the bubblewrap boundary). loop.py drives
episodes (plan, four-header steps from schema.py, feedback.py's turns), tools.py holds the
host tools the kernel's `tools` proxies call, backends.py the chat models (an endpoint or a
policy folder)."""

from jaxspatial.agents.backends import EndpointChat, PolicyChat
from jaxspatial.agents.kernel import CellResult, Kernel, KernelStartError, Limits
from jaxspatial.agents.kernel_program import static_check
from jaxspatial.agents.loop import (EpisodeInput, EpisodeResult, LoopConfig, run_episode,
                                    run_episodes)
from jaxspatial.agents.sandbox import SandboxUnavailable
from jaxspatial.agents.tools import EpisodeTools, ToolLimits

__all__ = ["CellResult", "EndpointChat", "EpisodeInput", "EpisodeResult", "Kernel",
           "EpisodeTools", "KernelStartError", "Limits", "LoopConfig", "PolicyChat",
           "SandboxUnavailable", "ToolLimits", "run_episode", "run_episodes",
           "static_check"]
