"""SpatialClaw's code-as-action agent: the model writes one Python cell per step; each cell
runs in a persistent, sandboxed kernel process per episode (kernel.py: the controller;
kernel_program/: the program inside; sandbox.py: the bubblewrap boundary). loop.py drives
episodes (plan, four-header steps from schema.py, feedback.py's turns), tools.py holds the
host tools the kernel's `tools` proxies call, backends.py the chat models (an endpoint or a
policy folder).

Modules:
- kernel.py (Kernel, Limits, CellResult: one sandboxed OS process per episode, persistent across
  cells; pipes with length-prefixed strict JSON + raw numeric arrays, never pickle; a kernel
  that breaks the protocol is killed; timeouts SIGKILL the process group, then a restart
  re-injects the preloaded state; rollback "full" / "partial"), kernel_program/ (the program
  inside, a package of standard library + numpy only (wire, checks, defences, summaries, names,
  runtime, __main__), copied whole into the episode's read-only folder: the
  namespace (InputImages, Metadata, np, scipy, math, PIL.Image, `tools` and `vlm` proxies
  (dotted names nest: tools.SAM3.video), show, ReturnAnswer through the side channel), preloaded
  names re-injected read-only after each cell, variable summaries under their own time limit,
  output caps, the AST first filter (NFKC identifiers, `!cmd` / `%magic` refused), audit hooks,
  an import guard (jax, torch, tensorflow), seccomp on x86_64 (no sockets, fork or exec)),
  sandbox.py (the bwrap command: new network / PID / IPC / UTS / mount namespaces, cleared
  environment, read-only binds of the interpreter and numpy / scipy / PIL only (not the
  repository, /work, $HOME or data), a private tmpfs; as root no user namespace (root ignores
  RLIMIT_NPROC) but a fresh random uid with no capabilities and no-new-privs; as a user
  --unshare-user --uid 65534; rlimits AS, NPROC, CPU, FSIZE, core; `run_python` for the OS-layer
  tests),
- schema.py (the four-header step, structured calls, the plan and its JSON checklist; bounded
  linear parsing, only StepFormatError raises),
- prompts.py (our wording), feedback.py (the feedback turn: status, capped output 1,000 + 3,000,
  filtered stderr, sub-queries, variables, the 500 MB warning, answer, inline images, tool
  counts, checklist; printed text indented so it cannot forge a header; condensed failed steps),
  scene_geometry.py (DepthGeometry, CloudGeometry, ModelGeometry, gravity_alignment: where
  Reconstruct's scene comes from), segmenters.py (InstanceMasks, SAM3Segmenter, identity by
  mask IoU), vlm_replies.py (locate_reply, split_thinking), tools.py (EpisodeTools: Reconstruct (a backend from perception, or the stored cloud and
  cameras, or synthetic depth; SpatialClaw's frame: +Y up, ground at 0, first camera at X = Z =
  0 looking -Z), RenderView / RenderBEV through jaxspatial.render, SAM3 / SAM3.video /
  SAM3.exists (SAM 3, or the synthetic instance maps; identity through frames by mask IoU), OCR
  (PP-OCRv4), vlm.locate / vlm.ask_with_thinking through the episode's model; ModelGeometry: DA3
  by default, Pi3 within 255,000 px), Project, Annotate, MaskStats; bounded arguments),
  backends.py (EndpointChat, PolicyChat: serving's PromptBuilder + Scheduler (from_folder: its
  own; from_scheduler: a benchmark backend's); concurrent episodes decode together and each step
  reuses its episode's slot (reuse_prefix=False: the whole history prefilled each step)),
  loop.py (LoopConfig with spatialclaw.md's defaults; modes full, react (alias structured),
  single_pass, no_utilities, no_perception, no_tools, blind, reflection; frame_selection: the
  paper's 32 frames, a video's sampled uniformly; run_episode / run_episodes: a thread pool, one
  kernel per episode; at most 30 steps and 5 answer attempts)
"""

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
