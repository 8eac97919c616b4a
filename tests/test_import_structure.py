"""The dependency order WORKSPACE.md draws, checked by parsing every import (no execution).

A failure names the importing file, the line and the rule it breaks."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOP = ("jaxspatial", "data_pipelines", "recipes", "launch", "configs", "benchmarks")

# jaxspatial's packages, lowest first: each may import only itself and those before it.
ORDER = (
    ("errors", "strict_json", "xla_workarounds", "web"),
    ("geometry",),
    ("render",),
    ("envs",),
    ("rl",),
    ("models",),
    ("rollout",),
    ("eval",),
    ("serving",),
    ("perception",),
    ("train",),
    ("agents",),
)
LEVEL = {name: level for level, names in enumerate(ORDER) for name in names}


def _modules():
  out = {}
  for top in TOP:
    for path in sorted((ROOT / top).rglob("*.py")):
      parts = path.relative_to(ROOT).with_suffix("").parts
      name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
      out[name] = path
  return out


MODULES = _modules()


def _imports(name, path):
  """(line, target module, imported names) for every import of a first-party module."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] in TOP:
          yield node.lineno, alias.name, ()
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = package.split(".")[:len(package.split(".")) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
      else:
        module = node.module or ""
      if module.split(".")[0] not in TOP:
        continue
      for alias in node.names:
        child = f"{module}.{alias.name}"
        yield node.lineno, child if child in MODULES else module, (alias.name,)


EDGES = {name: list(_imports(name, path)) for name, path in MODULES.items()}


def _where(name, line):
  return f"{MODULES[name].relative_to(ROOT)}:{line}"


def _folder(name):
  return MODULES[name].parent if name in MODULES else None


def test_jaxspatial_imports_nothing_above_it():
  bad = [f"{_where(name, line)} imports {target}" for name, edges in EDGES.items()
         if name.startswith("jaxspatial") for line, target, _ in edges
         if not target.startswith("jaxspatial")]
  assert not bad, "jaxspatial must not import data_pipelines, recipes, launch, configs:\n" + \
      "\n".join(bad)


def test_nothing_imports_a_launch_module():
  bad = [f"{_where(name, line)} imports {target}" for name, edges in EDGES.items()
         for line, target, _ in edges
         if target.startswith("launch") and not name.startswith("launch")]
  assert not bad, "launch/ is thin; move what is shared into recipes or jaxspatial:\n" + \
      "\n".join(bad)


def test_jaxspatial_packages_follow_the_dependency_order():
  bad = []
  for name, edges in EDGES.items():
    if not name.startswith("jaxspatial."):
      continue
    own = name.split(".")[1]
    for line, target, _ in edges:
      other = target.split(".")[1] if target.count(".") else None
      if other is None or other == own:
        continue
      assert own in LEVEL and other in LEVEL, f"{own} or {other} is missing from ORDER"
      if LEVEL[other] > LEVEL[own]:
        bad.append(f"{_where(name, line)}: {own} imports {other}, which comes after it")
  assert not bad, "\n".join(bad)


def test_no_private_name_crosses_a_package():
  bad = []
  for name, edges in EDGES.items():
    for line, target, names in edges:
      private = [n for n in names if n.startswith("_") and not n.startswith("__")]
      if private and target in MODULES and _folder(target) != _folder(name):
        bad.append(f"{_where(name, line)} imports {', '.join(private)} from {target}")
  assert not bad, "private names stay in their package:\n" + "\n".join(bad)


def _cycle(graph):
  state, stack = {}, []

  def visit(node):
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


@pytest.mark.parametrize("top", TOP)
def test_no_import_cycle(top):
  # Every import counts, also those inside functions: a deferred import that dodges a
  # cycle is still a cycle in the design.
  graph = {name: {target for _, target, _ in edges if target in MODULES and target != name
                  and not name.startswith(target + ".")}
           for name, edges in EDGES.items() if name.split(".")[0] == top}
  cycle = _cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)
