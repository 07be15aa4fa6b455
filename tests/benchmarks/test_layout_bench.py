"""benchmarks/'s layout (benchmarks/README.md): scripts in folders by kind import only the
shared modules at the top of benchmarks/, never another script; every script path that
gpu_check.sh, the README and the docs' pages name exists."""

import ast
import glob
import os
import re

import pytest

from dml_test_support import ROOT

BENCHMARKS = os.path.join(ROOT, "benchmarks")
KINDS = ("speed", "profiling", "device")
# script paths (not placeholders such as NAME.py, nor tests/benchmarks/...)
PATH = re.compile(r"(?<![\w/.])((?:benchmarks|experiments)/[a-z0-9_/]+\.(?:py|sh))\b")


def shared_modules() -> set[str]:
  return {name[:-3] for name in os.listdir(BENCHMARKS)
          if name.endswith(".py") and name != "__init__.py"}


def scripts() -> list[str]:
  return sorted(os.path.join(kind, name) for kind in KINDS
                for name in os.listdir(os.path.join(BENCHMARKS, kind))
                if name.endswith(".py") and name != "__init__.py")


def benchmark_imports(path: str) -> set[str]:
  """The ``benchmarks.*`` modules ``path`` imports (``from benchmarks import x`` -> 'x')."""
  with open(path) as f:
    tree = ast.parse(f.read())
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchmarks"):
      rest = node.module.split(".")[1:]
      out.update([".".join(rest)] if rest else [a.name for a in node.names])
    elif isinstance(node, ast.Import):
      out.update(a.name.split(".", 1)[1] for a in node.names
                 if a.name.startswith("benchmarks."))
  return out


def test_there_are_scripts_of_every_kind():
  assert {s.split(os.sep)[0] for s in scripts()} == set(KINDS)


@pytest.mark.parametrize("script", scripts())
def test_scripts_import_only_the_shared_modules(script):
  imported = benchmark_imports(os.path.join(BENCHMARKS, script))
  assert imported <= shared_modules(), (
      f"{script} imports {sorted(imported - shared_modules())}: move what scripts share "
      "into a module at the top of benchmarks/")


DOCS = ["benchmarks/device/gpu_check.sh", "README.md", "benchmarks/README.md",
        "requirements-bench.txt"] + sorted(
            os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


@pytest.mark.parametrize("doc", DOCS)
def test_named_script_paths_exist(doc):
  with open(os.path.join(ROOT, doc)) as f:
    named = set(PATH.findall(f.read()))
  missing = sorted(p for p in named if not os.path.exists(os.path.join(ROOT, p)))
  assert not missing, f"{doc} names {missing}"
