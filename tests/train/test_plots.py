"""curve.png / curve.svg (train/plots.py) read back as a reader would: a two-phase log with
known values is drawn, then the SVG's points are mapped to data through the axes' own tick
marks and labels, and compared with the logged values and a numpy moving average."""

import io
import json
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from PIL import Image

from jaxspatial.train.plots import training_curves

SVG = "{http://www.w3.org/2000/svg}"
SFT_STEPS, RL_STEPS, WINDOW = range(1, 25), range(25, 41), 5
WIDTH, PANEL_HEIGHT = 800, 200
NAN_STEP = 30  # a non-finite reward: logged, not drawn


def logged() -> list[dict]:
  """The rows MetricWriter would write: SFT steps, then RL steps ("<phase>/<metric>")."""
  rng = np.random.default_rng(0)
  rows = [{"step": s, "time": 1e9 + s, "sft/loss": 2.5 - 0.05 * s + 0.2 * rng.random(),
           "sft/grad_norm": 1.0} for s in SFT_STEPS]
  rows += [{"step": s, "time": 1e9 + s, "rl/loss": 0.3 * math.cos(s),
            "rl/reward": math.nan if s == NAN_STEP else s / 40 + 0.1 * rng.random(),
            "rl/kl": 0.01 * (s - 24), "rl/tokens": 300.0} for s in RL_STEPS]
  return rows


def series(rows, key):
  points = [(r["step"], r[key]) for r in rows if key in r and np.isfinite(r[key])]
  return np.array(points, float).T


def moving_average(values, window):
  """Trailing mean: np.convolve over full windows, the mean so far before the first one."""
  head = np.cumsum(values[:window - 1]) / np.arange(1, min(window, len(values) + 1))
  return np.concatenate([head, np.convolve(values, np.ones(window) / window, "valid")])


@pytest.fixture(scope="module")
def chart(tmp_path_factory):
  folder = tmp_path_factory.mktemp("run")
  rows = logged()
  (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  written = training_curves(folder / "metrics.jsonl", ("rl/reward",), title="tiny",
                            window=WINDOW, width=WIDTH, panel_height=PANEL_HEIGHT)
  return rows, written, ET.parse(folder / "curve.svg").getroot()


def group(root, gid):
  found = [g for g in root.iter(SVG + "g") if g.get("id") == gid]
  assert len(found) == 1, f"{len(found)} SVG groups with id {gid!r}"
  return found[0]


def axis_map(panel, axis: str):
  """Pixel -> data along `axis` ("x" or "y"), fitted to the panel's labelled ticks."""
  pixels, values = [], []
  for tick in panel.iter(SVG + "g"):
    if not (tick.get("id") or "").startswith(f"{axis}tick_"):
      continue
    text = next(tick.iter(SVG + "text"), None)
    if text is not None:
      pixels.append(float(next(tick.iter(SVG + "use")).get(axis)))
      values.append(float(text.text.replace("\u2212", "-")))
  assert len(pixels) >= 2, f"fewer than 2 labelled {axis} ticks"
  slope, offset = np.polyfit(pixels, values, 1)
  return lambda p: slope * np.asarray(p, float) + offset


def to_data(panel, xs, ys):
  return axis_map(panel, "x")(xs), axis_map(panel, "y")(ys)


def markers(root, gid):
  uses = list(group(root, gid).iter(SVG + "use"))
  return [float(u.get("x")) for u in uses], [float(u.get("y")) for u in uses]


def path_vertices(root, gid):
  d = next(group(root, gid).iter(SVG + "path")).get("d")
  numbers = np.array(re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", d), float)
  return numbers[0::2], numbers[1::2]


def test_panels_are_the_experiments_metrics_then_the_logged_defaults(chart):
  _, written, root = chart
  assert [p.name for p in written] == ["curve.png", "curve.svg"]
  panels = [g.get("id") for g in root.iter(SVG + "g") if (g.get("id") or "").startswith("panel:")]
  assert panels == ["panel:reward", "panel:loss", "panel:kl"]  # no accuracy logged


@pytest.mark.parametrize("phase, metric", [("sft", "loss"), ("rl", "loss"), ("rl", "reward"),
                                           ("rl", "kl")])
def test_raw_points_are_the_logged_values_of_each_phase(chart, phase, metric):
  rows, _, root = chart
  steps, values = series(rows, f"{phase}/{metric}")
  xs, ys = to_data(group(root, f"panel:{metric}"), *markers(root, f"raw:{metric}:{phase}"))
  np.testing.assert_allclose(xs, steps, atol=1e-3)  # the phase's whole step range
  np.testing.assert_allclose(ys, values, atol=1e-4 * np.ptp(values) + 1e-9)
  if metric == "reward":
    assert NAN_STEP not in np.round(xs)


@pytest.mark.parametrize("phase, metric", [("sft", "loss"), ("rl", "loss"), ("rl", "reward")])
def test_the_line_is_a_moving_average_within_the_phase(chart, phase, metric):
  rows, _, root = chart
  steps, values = series(rows, f"{phase}/{metric}")
  xs, ys = to_data(group(root, f"panel:{metric}"), *path_vertices(root, f"smooth:{metric}:{phase}"))
  np.testing.assert_allclose(xs, steps, atol=1e-3)
  np.testing.assert_allclose(ys, moving_average(values, WINDOW),
                             atol=1e-4 * np.ptp(values) + 1e-9)


@pytest.mark.parametrize("metric", ["reward", "loss", "kl"])
def test_the_boundary_sits_at_the_first_rl_step_in_every_panel(chart, metric):
  _, _, root = chart
  panel = group(root, f"panel:{metric}")
  xs, _ = path_vertices(root, f"boundary:{metric}:rl")
  np.testing.assert_allclose(axis_map(panel, "x")(xs), RL_STEPS[0], atol=1e-3)
  frame = axis_map(panel, "x")(path_vertices(root, f"panel:{metric}")[0])  # the axes' box
  assert frame.min() < SFT_STEPS[0] and frame.max() > RL_STEPS[-1]  # the whole run
  for phase in ("sft", "rl"):
    assert "".join(group(root, f"phase:{metric}:{phase}").itertext()).strip() == phase
  assert not [g for g in root.iter(SVG + "g") if g.get("id") == f"boundary:{metric}:sft"]


def test_png_is_an_image_of_the_expected_size_with_both_phases_colours(chart):
  _, written, _ = chart
  data = written[0].read_bytes()
  Image.open(io.BytesIO(data)).verify()  # a complete, uncorrupted PNG
  image = Image.open(io.BytesIO(data))
  assert image.format == "PNG" and image.size == (WIDTH, 3 * PANEL_HEIGHT)
  pixels = np.asarray(image.convert("RGB")).reshape(-1, 3).astype(int)
  for rgb in ((31, 119, 180), (255, 127, 14)):  # matplotlib's C0 (sft) and C1 (rl)
    assert (np.abs(pixels - rgb).max(axis=1) <= 8).sum() > 50, f"no {rgb} line drawn"


def test_a_log_without_chart_metrics_draws_nothing(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "sft/tokens": 3.0}\n')
  assert training_curves(tmp_path / "metrics.jsonl") == []
  assert not (tmp_path / "curve.png").exists()


def test_importing_jaxspatial_does_not_import_matplotlib():
  code = "import sys, jaxspatial.train; print(any(m.startswith('matplotlib') for m in sys.modules))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"
