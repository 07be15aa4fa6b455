"""The package's layout rules (docs/design.md "Layout"): two layers, the library below and the
application (``dml_jax.run``, and the analysis tools on top of it) above, with no library
module importing the application; no import cycle between dml_jax modules, at any level
(function-level imports included); no module much over 500 lines unless its docstring says
why."""

import ast
import os
import subprocess
import sys

import pytest

from dml_test_support import ROOT

PACKAGE = os.path.join(ROOT, "dml_jax")

# The top level of the package, each entry a module or a package. A new one is a decision:
# add it to one of the two layers here.
LIBRARY = ("data", "evaluation", "hparams", "kernels", "losses", "memory", "mining", "models",
           "objectives", "optimizers", "parallel", "similarity")
# The application: setup, step, loop, workdir, checkpoints, writers, signals, command-line
# plumbing, the evaluation of a workdir (run); the analysis tools restore a workdir with it.
APPLICATION = ("run", "analysis")


def module_files() -> dict[str, str]:
  """``{'dml_jax.evaluation.compute': path}`` for every module of the package."""
  out = {}
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
  return out


def import_graph() -> dict[str, set[str]]:
  """Module -> the dml_jax modules it imports anywhere in its code."""
  modules = module_files()
  graph = {}
  for name, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        edges.update(a.name for a in node.names if a.name in modules)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                          + ([node.module] if node.module else []))
        for alias in node.names:
          target = f"{base}.{alias.name}"
          if target in modules:
            edges.add(target)
          elif base in modules:
            edges.add(base)
    edges.discard(name)
    # A submodule importing its own package's __init__ (for a sibling) is not a cycle.
    graph[name] = {e for e in edges if not name.startswith(e + ".")}
  return graph


def find_cycle(graph):
  """One import cycle as a list of modules, or None."""
  state, stack = {}, []

  def visit(node):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_cycle_finder_finds_a_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package():
  graph = import_graph()
  assert "dml_jax.run.training" in graph and "dml_jax.run.eval_checkpoints" in graph
  assert "dml_jax.run.restore" in graph["dml_jax.run.eval_checkpoints"]
  assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def layer(module: str) -> str:
  """``'library'``, ``'application'`` or ``'unlisted'`` for a module ``dml_jax.X[...]``."""
  top = module.split(".")[1] if "." in module else ""
  if top in APPLICATION:
    return "application"
  return "library" if top in LIBRARY or not top else "unlisted"


def layering_violations(graph) -> list[str]:
  """``'importer -> imported'`` for every library module importing the application, and the
  application package ``run`` importing the tools on top of it (``analysis``)."""
  bad = []
  for name, edges in sorted(graph.items()):
    for target in sorted(edges):
      if layer(name) == "library" and layer(target) == "application":
        bad.append(f"{name} -> {target}")
      elif name.startswith("dml_jax.run") and target.startswith("dml_jax.analysis"):
        bad.append(f"{name} -> {target}")
  return bad


def test_every_top_level_module_is_in_a_layer():
  unlisted = sorted(m for m in module_files() if layer(m) == "unlisted")
  assert not unlisted, (
      f"{unlisted} are in neither layer: put an application module under dml_jax/run/, or add "
      "a new library module to LIBRARY in tests/test_layout.py")


def test_the_library_never_imports_the_application():
  graph = import_graph()
  assert "dml_jax.run.restore" in graph["dml_jax.analysis.common"]
  assert layering_violations(graph) == []


def test_the_layering_check_sees_a_violation():
  # Before the application had its package, evaluation/checkpoints.py imported training.
  graph = {"dml_jax.evaluation.checkpoints": {"dml_jax.run.training"},
           "dml_jax.similarity": set(), "dml_jax.run.training": {"dml_jax.similarity"},
           "dml_jax.run.workdir": {"dml_jax.analysis.common"}}
  assert layering_violations(graph) == [
      "dml_jax.evaluation.checkpoints -> dml_jax.run.training",
      "dml_jax.run.workdir -> dml_jax.analysis.common"]
  assert layer("dml_jax.launcher") == "unlisted"   # a new top-level module


@pytest.mark.parametrize("name", sorted(module_files()))
def test_modules_stay_short_or_say_why(name):
  path = module_files()[name]
  with open(path) as f:
    text = f.read()
  lines = text.count("\n")
  docstring = ast.get_docstring(ast.parse(text)) or ""
  assert lines <= 560 or "longer than" in docstring, (
      f"{path} has {lines} lines; split it by concern (docs/design.md 'Layout') or say in its "
      "docstring why it is longer than ~500 lines.")


def test_command_line_tools_are_not_imported_by_their_packages():
  """``python -m dml_jax.X.tool`` warns (runpy RuntimeWarning) when a package on the way
  imported ``tool`` already; importing every package must leave every tool unimported."""
  tools = []
  for name, path in module_files().items():
    with open(path) as f:
      if '__name__ == "__main__"' in f.read():
        tools.append(name)
  packages = sorted({t.rpartition(".")[0] for t in tools} | {"dml_jax"})
  code = (f"import importlib, sys\nfor p in {packages!r}: importlib.import_module(p)\n"
          f"print([t for t in {tools!r} if t in sys.modules])")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True)
  assert "dml_jax.models.pretrained" in tools
  assert out.stdout.strip() == "[]", out.stdout


def test_the_binaries_leave_scikit_learn_unimported():
  """scikit-learn (and the SciPy it loads) takes seconds to import: what train.py and eval.py
  import leaves it out (only ``eval.kmeans='sklearn'`` and the digits loader import it)."""
  code = ("import sys\nimport dml_jax.run.cli, dml_jax.run.training, dml_jax.run.eval_checkpoints"
          "\nprint(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True)
  assert out.stdout.strip() == "[]", out.stdout
