"""Training charts with matplotlib (Agg; imported only when drawing, so importing jaxspatial
stays light).

`training_curves(metrics.jsonl)` draws a whole run from its log: every phase on one global-step
axis, each phase's start marked (a dashed line and its name), one panel per metric, each step's
value as a faint point and its running mean as a line; written as curve.png and curve.svg
beside the log. A row's metrics are named "<phase>/<metric>" (the trainer's MetricWriter rows),
so the log alone says which phase each step belonged to, including steps before a resume.

Artists carry SVG ids: "panel:<metric>", "raw:<metric>:<phase>", "smooth:<metric>:<phase>",
"boundary:<metric>:<phase>" and "phase:<metric>:<phase>" (the name at a phase's start).
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
from etils import epath

from jaxspatial.train.metrics import read_jsonl

# Drawn when the log holds them, after the experiment's own curve metrics.
DEFAULT_METRICS = ("reward", "accuracy", "loss", "kl")
_NOT_METRICS = ("step", "time")
_RC = {"svg.fonttype": "none",   # text stays text: smaller, searchable SVG
       "svg.hashsalt": "jaxspatial",  # the same log gives the same SVG
       "axes.spines.top": False, "axes.spines.right": False}


def split_name(key: str) -> tuple[str, str]:
  """"rl/accuracy/explore" -> ("rl", "accuracy/explore"); an unprefixed "loss" -> ("", "loss")."""
  phase, _, metric = key.partition("/")
  return (phase, metric) if metric else ("", key)


def running_mean(values, window: int) -> np.ndarray:
  """Each value's mean with the `window - 1` before it (fewer at the start)."""
  values = np.asarray(values, float)
  if window < 1:
    raise ValueError(f"running_mean: window must be >= 1, got {window}")
  sums = np.concatenate([[0.0], np.cumsum(values)])
  ends = np.arange(1, len(values) + 1)
  counts = np.minimum(ends, window)
  return (sums[ends] - sums[ends - counts]) / counts


def phases_of(rows: list[dict]) -> dict[str, int]:
  """{phase: its first step} in step order, a row's phase being its first metric's prefix."""
  starts = {}
  for row in sorted(rows, key=lambda r: r["step"]):
    keys = [k for k in row if k not in _NOT_METRICS]
    if keys:
      starts.setdefault(split_name(keys[0])[0], int(row["step"]))
  return starts


def _series(rows: list[dict], metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{phase: (steps, finite values)} of one metric, in step order."""
  out = {}
  for row in sorted(rows, key=lambda r: r["step"]):
    for key, value in row.items():
      phase, name = split_name(key)
      if key not in _NOT_METRICS and name == metric and value is not None and np.isfinite(value):
        xs, ys = out.setdefault(phase, ([], []))
        xs.append(int(row["step"]))
        ys.append(float(value))
  return {phase: (np.asarray(xs), np.asarray(ys)) for phase, (xs, ys) in out.items()}


def chosen_metrics(rows: list[dict], metrics=()) -> list[str]:
  """The panels: `metrics` (names with or without a phase prefix, as an experiment's
  `curve_metrics`), then DEFAULT_METRICS, each once and only if the log holds it."""
  logged = {split_name(k)[1] for row in rows for k in row if k not in _NOT_METRICS}
  phases = set(phases_of(rows))
  wanted = [split_name(m)[1] if split_name(m)[0] in phases else m for m in metrics]
  return [m for m in dict.fromkeys([*wanted, *DEFAULT_METRICS]) if m in logged]


@contextlib.contextmanager
def _figure(width: int, height: int, dpi: int, panels: int):
  """A figure of `panels` stacked axes sharing x, under this module's style; pyplot-free (no
  global state: callers in threads or notebooks are unaffected)."""
  # pylint: disable=import-outside-toplevel
  import matplotlib
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  with matplotlib.rc_context(_RC):
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    yield figure, figure.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]


def _save(figure, path, fmt: str) -> epath.Path:
  path = epath.Path(path)  # a local or a remote (gs://) file
  path.parent.mkdir(parents=True, exist_ok=True)
  buffer = io.BytesIO()
  figure.savefig(buffer, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
  path.write_bytes(buffer.getvalue())
  return path


def training_curves(metrics_jsonl, metrics=(), title: str = "", window: int = 10,
                    out_dir=None, width: int = 1000, panel_height: int = 240,
                    dpi: int = 100) -> list[epath.Path]:
  """Draws the run logged in `metrics_jsonl` (see the module docstring) to curve.png and
  curve.svg in `out_dir` (default: the log's folder), `width` x `panel_height` pixels per
  panel; lines are `window`-step running means within each phase. Returns the files written
  ([] when the log holds none of the metrics)."""
  rows = [r for r in read_jsonl(metrics_jsonl) if "step" in r]
  names = chosen_metrics(rows, metrics)
  if not names:
    return []
  starts = phases_of(rows)
  colours = {phase: f"C{i}" for i, phase in enumerate(starts)}
  steps = [int(r["step"]) for r in rows]
  with _figure(width, panel_height * len(names), dpi, len(names)) as (figure, axes):
    for ax, metric in zip(axes, names):
      ax.set_gid(f"panel:{metric}")
      for phase, (xs, ys) in _series(rows, metric).items():
        ax.plot(xs, ys, "o", ms=2.5, alpha=0.25, color=colours[phase],
                gid=f"raw:{metric}:{phase}")
        ax.plot(xs, running_mean(ys, window), "-", lw=1.6, color=colours[phase],
                gid=f"smooth:{metric}:{phase}")
      for i, (phase, start) in enumerate(starts.items()):
        if i:  # the first phase starts at the left edge
          ax.axvline(start, color="0.4", ls="--", lw=1, gid=f"boundary:{metric}:{phase}")
        if phase:  # unprefixed metrics have no phase to name
          ax.text(start, 0.98, f" {phase}", transform=ax.get_xaxis_transform(), va="top",
                  ha="left", fontsize=9, fontweight="bold", color=colours[phase],
                  bbox={"fc": "white", "ec": "none", "alpha": 0.7, "pad": 1},
                  gid=f"phase:{metric}:{phase}")
      ax.set_ylabel(metric)
      ax.tick_params(labelbottom=True)  # each panel reads alone
      ax.grid(alpha=0.3)
    pad = max(1, (max(steps) - min(steps)) // 50)
    axes[0].set_xlim(min(steps) - pad, max(steps) + pad)
    from matplotlib.ticker import MaxNLocator  # pylint: disable=import-outside-toplevel
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))  # shared: no step 2.5
    axes[-1].set_xlabel(f"step (points: each step; lines: {window}-step running mean "
                        "within a phase)")
    if title:
      figure.suptitle(title)
    folder = epath.Path(out_dir) if out_dir is not None else epath.Path(metrics_jsonl).parent
    return [_save(figure, folder / f"curve.{fmt}", fmt) for fmt in ("png", "svg")]
