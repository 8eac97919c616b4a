"""SpatialClaw (training-free code-as-action agent) for `launch.eval --benchmark NAME --agent
spatialclaw`: the loop's settings (jaxspatial.agents.loop.LoopConfig; the paper's defaults,
spatialclaw.md section 7), the kernel's limits (jaxspatial.agents.kernel.Limits), the host
tools' bounds (jaxspatial.agents.tools.ToolLimits) and where the perception models come from.

Variants: `reference` (the published settings: 30 steps, 32 frames at a 768-pixel long
edge (a video's sampled uniformly, separate images the first 32), temperature 0.6,
planning on, reflection off, 8 episodes at a time, 600 s cells, Reconstruct by Depth
Anything 3) and `cpu` (a few short steps for a tiny policy or a scripted endpoint on this
machine, Reconstruct from the benchmark's stored clouds).

Geometry for tools.Reconstruct, `reconstruction.backend`: "da3" (the paper's, the default:
Depth Anything 3 DA3NESTED-GIANT-LARGE from the folder `reconstruction.checkpoint`; its
weights are not here, so the run stops at once naming the folder and these options),
"pi3" (Pi3 from `reconstruction.checkpoint`, frames resized to multiples of 14 within
`reconstruction.pi3_pixels` = 255,000 pixels; 0: Think3D's sizing) or "vggt": each call
reconstructs the requested frames; "stored" (the benchmark's stored cloud and input
cameras: a build with --caches, or ScanNet scans; none stored: Reconstruct says so);
"none". tools.SAM3: SAM 3 from `perception.models.sam3` (a Hugging Face folder), else
unavailable. OCR: PP-OCRv4 (its weights ship in the wheel). `agent.frame_selection`
"uniform" samples separate images uniformly too; `agent.mode` "react" is the paper's
structured-invocation ablation. This config is for evaluation only (no `recipe`: nothing
trains SpatialClaw).
"""

from ml_collections import ConfigDict


def get_config(variant: str = "reference"):
  if variant not in ("reference", "cpu"):
    raise ValueError(f"spatialclaw: unknown variant {variant!r}; expected reference or cpu")
  c = ConfigDict()
  c.agent = ConfigDict(dict(
      name="spatialclaw", mode="full", max_steps=30, max_answer_attempts=5,
      image_long_edge=768, frames_shown=32, frame_selection="paper", temperature=0.6,
      max_tokens=8192,
      plan_max_tokens=8192, concurrency=8, planning=True, reflection=False,
      reflection_every=5, checklist_every=5, max_images_per_step=16,
      max_context_images=96))
  c.kernel = ConfigDict(dict(
      cell_timeout_s=600.0, summary_timeout_s=5.0, memory_bytes=4 << 30, processes=64,
      stdout_bytes=1 << 20, max_images=250, rollback="full"))
  c.tools = ConfigDict(dict(max_frames=64, max_vlm_calls=32, max_images=64,
                            vlm_max_tokens=1024, vlm_thinking_max_tokens=8192))
  c.reconstruction = ConfigDict(dict(backend="da3", checkpoint="", device="cpu",
                                     pi3_pixels=255_000))
  c.perception = ConfigDict(dict(models=ConfigDict(dict(sam3="")), device="cpu"))
  if variant == "cpu":
    c.agent.update(max_steps=3, image_long_edge=224, frames_shown=8, max_tokens=256,
                   plan_max_tokens=256, concurrency=2, max_context_images=16)
    c.kernel.update(cell_timeout_s=60.0, memory_bytes=2 << 30)
    c.tools.update(max_vlm_calls=4, vlm_max_tokens=64, vlm_thinking_max_tokens=256)
    c.reconstruction.update(backend="stored")
  return c
