"""Evaluation results as the issue's results.json and a Markdown table in the papers'
layout: rows = settings (models, with / without tools), columns = the benchmark's
categories then Overall, each cell "mean ± std" over seeds in percent; a row of
differences for each compared pair of settings. Both files are written atomically."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Mapping, Sequence

SPREAD = "sample standard deviation over seeds (ddof 1; 0 for one seed)"


def _difference(a: dict, b: dict) -> dict:
  return {"accuracy": a["accuracy"] - b["accuracy"], "n": a["n"]}


def results_document(settings: Mapping[str, dict], benchmark: str = "",
                     primary: str | None = None, columns: Sequence[str] | None = None,
                     labels: Mapping[str, str] | None = None,
                     compare: Sequence[tuple[str, str]] = (), **meta) -> dict:
  """The results.json document: {"benchmark", "primary", "overall", "categories" (the
  primary setting's; default the first), "settings": {name: {"overall", "categories"}},
  "columns" (the table's order), "labels" (column -> header), "comparisons" ({"a - b":
  differences of the means}), "spread", "unit": "fraction", and `meta`}."""
  if not settings:
    raise ValueError("results_document.settings: expected at least one setting, got none")
  primary = next(iter(settings)) if primary is None else primary
  if primary not in settings:
    raise ValueError(f"results_document.primary: expected one of {list(settings)}, "
                     f"got {primary!r}")
  if columns is None:
    columns = list(dict.fromkeys(c for s in settings.values() for c in s["categories"]))
  comparisons = {}
  for a, b in compare:
    for name in (a, b):
      if name not in settings:
        raise ValueError(f"results_document.compare: no setting {name!r} in {list(settings)}")
    first, second = settings[a], settings[b]
    comparisons[f"{a} - {b}"] = {
        "overall": _difference(first["overall"], second["overall"]),
        "categories": {c: _difference(first["categories"][c], second["categories"][c])
                       for c in columns
                       if c in first["categories"] and c in second["categories"]}}
  return {"benchmark": benchmark, "primary": primary,
          "overall": settings[primary]["overall"],
          "categories": settings[primary]["categories"],
          "settings": {name: dict(value) for name, value in settings.items()},
          "columns": list(columns), "labels": {c: (labels or {}).get(c, c) for c in columns},
          "comparisons": comparisons, "spread": SPREAD, "unit": "fraction", **meta}


def _cell(entry: dict | None, seeds: bool) -> str:
  if entry is None:
    return "–"
  value = f"{100 * entry['accuracy']:.2f}"
  return f"{value} ± {100 * entry['std']:.2f}" if seeds else value


def _signed(entry: dict | None) -> str:
  return "–" if entry is None else f"{100 * entry['accuracy']:+.2f}"


def markdown_table(document: dict, title: str | None = None) -> str:
  """The paper-layout table of a results document (percent)."""
  columns, labels = document["columns"], document["labels"]
  settings = document["settings"]
  seeds = max((len(s["overall"].get("seeds", ())) for s in settings.values()), default=1)
  header = ["Setting", *(labels.get(c, c) for c in columns), "Overall"]
  lines = []
  if title is None and document.get("benchmark"):
    title = document["benchmark"]
  if title:
    lines += [f"## {title}", ""]
  lines += ["| " + " | ".join(header) + " |",
            "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
  for name, result in settings.items():
    cells = [_cell(result["categories"].get(c), seeds > 1) for c in columns]
    lines.append("| " + " | ".join([name, *cells, _cell(result["overall"], seeds > 1)]) + " |")
  for name, diff in document.get("comparisons", {}).items():
    cells = [_signed(diff["categories"].get(c)) for c in columns]
    lines.append("| " + " | ".join([f"Δ {name}", *cells, _signed(diff["overall"])]) + " |")
  primary = settings[document["primary"]]
  counts = ", ".join(f"{labels.get(c, c)} {primary['categories'][c]['n']}"
                     for c in columns if c in primary["categories"])
  overall = primary["overall"]
  mode = {"micro": "over all questions", "macro": "the mean of the columns"}.get(
      overall.get("mode", ""), "")
  lines += ["", f"Questions: {counts}; overall {overall['n']}"
            + (f" ({mode})" if mode else "") + "."]
  lines.append(f"Percent; mean ± {SPREAD}, {seeds} seed{'s' if seeds != 1 else ''}."
               if seeds > 1 else "Percent; one seed.")
  if "failures" in document:
    lines.append(failures_line(document))
  return "\n".join(lines) + "\n"


def failures_line(document: dict) -> str:
  """The results' failure counts as one line: "Failed requests or episodes (scored 0):
  no_tools 0 of 3150; tools 3 of 3150 (Rotation 1, Among 2)."."""
  labels = document.get("labels", {})
  parts = []
  for setting, entry in document["failures"].items():
    where = ", ".join(f"{labels.get(c, c)} {n}" for c, n in entry["categories"].items())
    parts.append(f"{setting} {entry['failed']} of {entry['items']}"
                 + (f" ({where})" if where else ""))
  return "Failed requests or episodes (scored 0): " + "; ".join(parts) + "."


def write_text_atomically(path, text: str) -> None:
  """`text` to `path` through a temporary file in its folder and a rename, with mode 0644
  (a results file others read; mkstemp's own is 0600)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    os.fchmod(handle, 0o644)
    with os.fdopen(handle, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
  except BaseException:
    pathlib.Path(temporary).unlink(missing_ok=True)
    raise


def write_results(out_dir, document: dict, title: str | None = None) -> dict:
  """Writes `out_dir/results.json` and `out_dir/results.md` (each atomically: a temporary
  file in the folder, then a rename); returns {"json": path, "md": path}."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = {"json": out / "results.json", "md": out / "results.md"}
  write_text_atomically(paths["json"], json.dumps(document, indent=2, sort_keys=False) + "\n")
  write_text_atomically(paths["md"], markdown_table(document, title))
  return paths
