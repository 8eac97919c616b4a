"""Pure, jit- and vmap-able environments: reset(key, task, params), step(key, state, action, params).

Modules:
- task.py: Task, the padded pytree an episode is about (several reference answers; the input
  views' images when the dataset has them); decode_text
- act3d.py: Act3D navigation (eq. 1); act3d_host.py: its numpy host twin (baseline)
- think3d.py: Think3D's view tool (the input views; ego / global views of a point cloud, input
  cameras drawn in global views; (0, 0) = the input image; with_reconstruction: the cloud and
  input poses from a reconstruction host tool over the task's input images, inside jit / vmap)
- image_tools.py: PERIA's interaction tools (crop, line, path, box, highlight, label)
- peria.py: PERIA's image workspace (the running image list; a tool on image k appends its
  result; image 0 (`initial_image`) is the task's input view at its initial camera when the task
  carries images (a static shape: a benchmark's stored views, e.g. ChartQA's chart; their size
  must be the params'), else a render of the scene from the initial camera)

Pure functions in the gymnax style: `reset(key, task, params) -> (obs, state)` and `step(key,
state, action, params) -> (obs, state, reward, done, info)`. State, task, action and observation
are fixed-shape pytrees; the state carries the task. `params` is a flax struct with only static
fields, so jit specialises on it. Rewards that need the final answer come from `jaxspatial.rl`;
environments return reward 0 and report what they observe in `info`. A bad action (unknown
primitive, NaN, out-of-range index or angle, acting after `done`) sets `info["invalid"]` and
leaves the state unchanged.

**Act3D** (`envs/act3d.py`), the paper's eq. (1) exactly, plus our choices where it is silent:
`max_interactions` moves, then only the answer (a stop after the last move is accepted; a
further move is refused and ends the episode); the pitch is clamped to +-85 degrees (a turn past
it stops there, so the lateral axis `f x z` always exists; the initial camera and absolute
actions are clamped too); the multiplier rounds halves up with a 1e-4 tolerance (0.9 m of 0.6 m
steps is 2, not float32's 1); the observation renders 640x480 at a 90-degree horizontal field of
view (the paper does not give one); the look-at point in the observation text is 1 m ahead; an
answer object is seen once its points win 25 pixels of one view. Absolute actions are clamped to
the same box.

**Think3D** (`envs/think3d.py`). Paper and public code disagree; we follow the paper and keep
the code's behaviour as options (the full list: PAPERS.md). Turns are in the anchor
camera's frame, as both sources do; `up=(0, 0, 1)` turns about a world axis and keeps the
horizon level. The pull-back moves the near plane with the camera, so it widens the view without
adding what lies behind the orbit position. `reset` returns the prompt's `num_prompt_images`
input views (`Task.input_images`, or renders of the input cameras when the dataset has none;
background past `num_input_cameras`, masked by the prompt); `(0, 0)` from an anchor returns its
input image (`Task.input_images`, or a render of the anchor camera). `max_rounds` views, then
only the answer: an action after the last round is invalid and sets `done` (the one exception to
"a bad action leaves the state unchanged"). Global views draw the real input cameras
(`render/markers.py`: pyramids, dots, `CamN` labels, `*` on the anchor) on top of the points,
not cut by the pull-back's near plane, as the code draws them after its scatter. With online
reconstruction (`Think3DAgent.with_reconstruction`, the recipes' `reconstruction.backend`) reset
first replaces the task's cloud, input poses (intrinsics kept: the images' own), initial camera
and bounds by a reconstruction of its first `num_input_cameras` input images, one host call per
batch; a failed call in "flag" mode leaves no point, and the episode starts done.

**PERIA tools** (`envs/image_tools.py`): `(image, valid)` from each; PIL conventions (crop boxes
in edge coordinates, drawn boxes inclusive of both ends; pixel coordinates are valid in [0, W] x
[0, H], and what is drawn past the last pixel is clipped as PIL does); `scale=` takes normalised
or Qwen 0-1000 coordinates (valid in [0, scale]), mapped by `pixel_map` ("floor": the public
server's int(c * size / 1000); "centres"); a crop samples only its box's pixels; `draw_path` can
mark its waypoints; `image_label` draws a marker without text.

**PERIA environment** (`envs/peria.py`). The public server's six tools with its argument names
(`image_index`; `bounding_box` / `coordinates` / `points` / `text` + `position`) and drawing
styles. Host perception tools (`text_tools`, after the six) take `image_index` alone (argument
-1), a `bounding_box`, or a text argument (`TEXT_ARGUMENTS`: `text_prompt`, `question`; no
points), which the agent passes to its TextTool as that keyword, so a tool given a key it does
not take answers with its own error text (as the public server fails on an unexpected keyword);
an interaction tool given a text key is an "arguments" error, and a perception tool's refused
call gets the generic `Error executing the tool: invalid arguments.` PERIA's tasks are images;
ours are 3D scenes, so image 0 renders the task's initial camera (the same tasks serve all three
agents). A crop is resized back to the observation size. An invalid call changes nothing,
returns an all-zero image with index -1 and names its error (`info["error"]`: limit, arguments,
image_index, path_points, in the public order); an action kind that is neither a tool nor stop
is an "arguments" error and counts as a call. The budget is max_turns - 1 calls; a call past it
is invalid and ends the episode; `max_images >= max_turns` is required. Messages are the public
strings (success with "Observation k:", `Error: Invalid image index.`, the path-points error,
`Error executing {tool}: invalid arguments.`, the format error after which the episode
continues), chosen per episode by `PeriaAgent.observation_variant`. On device, R_format is +1
for an episode ending in a well-formed answer, 0 for one that made calls but no answer
(truncated), -1 otherwise; R_correct is the public manager's rule (`device_text.peria_correct`,
a documented subset) against the references (a multiple-choice task's option letter), or a host
judge's YES where the public gate lets it ask. The recipe trains on `peria_agent.text_rewards`,
the public reward manager on the text: R_rep on the model text (user turns left out), R_format
and R_correct (`text.peria_correct`) on the whole decoded response, observation messages
included, the references from the step's tasks; a judge's YES counts where the host's gate
agrees.
"""

from jaxspatial.envs import act3d, image_tools, think3d
from jaxspatial.envs.act3d import Act3DAction, Act3DObservation, Act3DParams, Act3DState
from jaxspatial.envs.task import Task, decode_text
from jaxspatial.envs.think3d import (Think3DAction, Think3DObservation, Think3DParams,
                                     Think3DState)

__all__ = ["Act3DAction", "Act3DObservation", "Act3DParams", "Act3DState", "Task",
           "Think3DAction", "Think3DObservation", "Think3DParams", "Think3DState", "act3d", "image_tools",
           "decode_text", "think3d"]
