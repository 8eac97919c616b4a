"""The prepared device benchmark: its smoke mode end to end (every part, tiny sizes, on
the CPU, in its own process) and its compile worker. Timings go into the report; nothing
here asserts one."""

import json
import math
import os
import pathlib
import subprocess
import sys
import threading

import pytest

from benchmarks import device_suite

# Compile-heavy end to end: `make slow-tests` (not in `make test`).
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _positive(value) -> bool:
  return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  out = tmp_path_factory.mktemp("device_suite")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  done = subprocess.run([sys.executable, "-m", "benchmarks.device_suite", "--smoke", "--out",
                         str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert "| part | status |" in done.stdout  # the Markdown tables
  return json.loads((out / "report.json").read_text())


def test_every_part_ran_without_error(report):
  assert report["recipes"]["status"] == "not requested"  # a call of its own (below)
  for part in device_suite.DEFAULT_PARTS:
    assert report[part]["status"] == "ok", (part, report[part].get("error"))
    assert report[part]["error"] is None
  assert report["meta"]["smoke"] and not report["meta"].get("deadline_hit")


def test_versions(report):
  versions = report["versions"]
  assert versions["jax"] and versions["jaxlib"] and versions["flax"]
  assert versions["platform"] == "cpu" and versions["device_count"] >= 1
  assert versions["scatter_regression_affected"] is False  # GPUs only


def test_pitfalls(report):
  pitfalls = report["pitfalls"]
  rows = {r["case"]: r for r in pitfalls["scatter_add"]["rows"]}
  for case in ("uniform", "contended"):
    assert _positive(rows[case]["float32_ms"]) and _positive(rows[case]["int32_ms"])
    assert _positive(rows[case]["f32_over_int32"])
  assert isinstance(pitfalls["scatter_add"]["bites"], bool)
  assert len(pitfalls["segment_sum"]["rows"]) == 6
  assert all(_positive(r["ms"]) for r in pitfalls["segment_sum"]["rows"])
  assert device_suite.FTZ_ATOMICS_OPTION in pitfalls["workaround"]["flag"]
  if not pitfalls["scatter_add"]["bites"]:
    assert "skipped" in pitfalls["remeasure"]


def test_renderer(report):
  renderer = report["renderer"]
  sizes = report["meta"]["sizes"]
  expected = {(p, r, v) for p in sizes["render_points"] for r in sizes["render_radii"]
              for v in sizes["render_views"]}
  rows = renderer["rows"]
  assert {(r["points"], r["radius"], r["views"]) for r in rows} == expected
  assert not renderer["skipped"]
  for row in rows:
    assert "error" not in row, row
    assert _positive(row["ms_per_view"]) and _positive(row["points_per_s"])
  baselines = {b["renderer"] for b in renderer["host_baselines"]}
  assert "numpy, Think3D method" in baselines
  if "open3d" not in renderer:  # open3d imported
    assert "open3d project_to_rgbd_image" in baselines
    assert all(_positive(r["speedup"]) for r in rows)
  assert {r["pattern"].split(" ")[0] for r in renderer["scatter_min"]} == {"uniform", "clustered"}
  assert all(_positive(r["updates_per_s"]) for r in renderer["scatter_min"])


def test_rollout(report):
  rollout = report["rollout"]
  assert not rollout["skipped"] and not rollout.get("row_errors")
  (row,) = rollout["rows"]
  assert row["batch"] == report["meta"]["sizes"]["rollout_batches"][0]
  assert row["all_turns_played"]
  for key in ("run_s", "generated_tokens_per_s", "episodes_per_s", "vision_s", "render_s",
              "compile_s"):
    assert _positive(row[key]), key
  shares = [row["vision_share"], row["render_share"], row["decode_share"]]
  assert all(0 <= s <= 1 for s in shares) and sum(shares) == pytest.approx(1.0, abs=0.02)
  assert pathlib.Path(row["trace_dir"]).is_dir()
  host = rollout["host_loop"]
  assert _positive(host["run_s"]) and _positive(host["compiled_speedup"])


def test_train(report):
  train = report["train"]
  for key in ("step_s", "tokens_per_s", "loss_tokens_per_s", "flops", "compile_s"):
    assert _positive(train[key]), key
  assert train["finite"] and train["remat"] and train["micro_batches"] == 2
  assert train["mfu"] is None  # no peak FLOP/s for a CPU
  assert _positive(train["logprobs"]["run_s"])
  assert train["logprobs"]["max_abs_diff_vs_rollout"] < 0.1  # bf16 sampler vs trainer


def test_recipes_part_runs_one_rl_step_of_each_recipe(tmp_path):
  """`--parts recipes` at smoke sizes: each recipe's row from its own process."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  done = subprocess.run([sys.executable, "-m", "benchmarks.device_suite", "--smoke", "--parts",
                         "recipes", "--out", str(tmp_path)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert "### recipes" in done.stdout
  part = json.loads((tmp_path / "report.json").read_text())["recipes"]
  assert part["status"] == "ok" and not part["skipped"], part
  rows = {r["recipe"]: r for r in part["rows"]}
  assert set(rows) == set(device_suite.Sizes.smoke().recipes)
  families = {"act3d_grpo": "qwen3_5", "think3d_rl": "qwen3_vl", "peria_or_gigpo": "qwen3_vl"}
  for name, row in rows.items():
    assert "error" not in row, row
    assert row["family"] == families[name]
    for key in ("episodes_per_s_shared", "episodes_per_s_per_row", "sharing_speedup",
                "step_s", "update_tokens_per_s", "estimate_bytes"):
      assert _positive(row[key]), (name, key)
    assert row["mfu"] is None  # no peak FLOP/s for a CPU


@pytest.mark.parametrize("serial", [False, True])
def test_worker_runs_jobs_once(serial):
  """Background: in submission order; serial: each when first asked for."""
  worker = device_suite.Worker(serial=serial)
  order = []
  first = worker.submit("first", lambda: order.append("first") or 1)
  second = worker.submit("second", lambda: order.append("second") or first.result() + 1)
  failing = worker.submit("failing", lambda: 1 / 0)
  assert second.result(timeout=10) == 2 and first.result() == 1
  with pytest.raises(ZeroDivisionError):
    failing.result(timeout=10)
  assert order == (["second", "first"] if serial else ["first", "second"])
  assert first.seconds is not None


def test_worker_result_times_out():
  worker = device_suite.Worker(serial=False)
  release = threading.Event()
  blocked = worker.submit("blocked", release.wait)
  with pytest.raises(TimeoutError):
    blocked.result(timeout=0.05)
  assert worker.busy()
  release.set()
  assert blocked.result(timeout=10) is True
  assert worker.wait_idle(10) and not worker.busy()


def test_remeasure_runs_a_child_with_the_flag():
  """The path taken when the f32 scatter-add bites (on an affected GPU): a fresh process
  whose XLA_FLAGS carry the workaround (the CPU backend accepts the option too)."""
  result = device_suite.remeasure_with_flag(device_suite.Sizes.smoke(), timeout_s=300)
  assert result["returncode"] == 0, result.get("error")
  assert device_suite.FTZ_ATOMICS_OPTION in result["xla_flags"]
  assert [r["case"] for r in result["rows"]] == ["uniform", "contended"]
  assert isinstance(result["fixed"], bool)


def test_the_raw_child_drops_the_workaround_from_xla_flags():
  option = device_suite.FTZ_ATOMICS_OPTION
  drop = device_suite.without_backend_option
  assert drop(f"--xla_backend_extra_options={option}", option) == ""
  assert (drop(f"--xla_gpu_autotune_level=0 --xla_backend_extra_options=a=1,{option}", option)
          == "--xla_gpu_autotune_level=0 --xla_backend_extra_options=a=1")


def test_peak_flops_by_device_kind():
  assert device_suite.peak_flops("NVIDIA H200") == 989e12
  assert device_suite.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert device_suite.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
  assert device_suite.peak_flops("TPU v5 lite") == 197e12
  assert device_suite.peak_flops("TPU v5p") == 459e12
  assert device_suite.peak_flops("TPU v4") == 275e12
  assert device_suite.peak_flops("TPU v6 lite") == 918e12
  assert device_suite.peak_flops("cpu") is None


def test_decode(report):
  """Long-context decode rows for both caches; the hybrid's grows with the context at a
  quarter of the KV cache's rate (one attention layer of four, the same KV shape)."""
  decode = report["decode"]
  contexts = report["meta"]["sizes"]["decode_contexts"]
  rows = {(r["model"], r["context"]): r for r in decode["rows"]}
  assert not decode.get("skipped") and len(rows) == 2 * len(contexts)
  assert all(_positive(r["decode_tok_s"]) and _positive(r["cache_bytes"])
             for r in rows.values())
  kv, hybrid = sorted({name for name, _ in rows})
  assert kv.startswith("qwen2_5_vl") and hybrid.startswith("qwen3_5")
  growth = lambda name: rows[name, contexts[-1]]["cache_bytes"] - rows[name, contexts[0]]["cache_bytes"]
  assert 4 * growth(hybrid) == growth(kv)


def test_serving(report):
  serving = report["serving"]
  assert {r["engine"] for r in serving["rows"]} == {"static batcher", "continuous"}
  for row in serving["rows"]:
    assert _positive(row["tokens_s"]) and _positive(row["p99"]) and row["p50"] <= row["p99"]
    assert row["tokens"] == serving["rows"][0]["tokens"]  # the same load, every reply whole
  assert _positive(serving["continuous_over_static"])
