"""The documentation: the site builds with warnings as errors, its API reference holds every
public function and class of ``dml_jax``, the README's library example runs, and every
documented command names configs, config keys and flags that exist.

The site is built with ``mkdocs build --strict`` (broken links, unknown references and
docstrings the reference cannot parse fail); ``requirements-test.txt`` installs mkdocs, so
the build runs wherever the test suite is set up as the README says.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _readme_block(marker: str) -> str:
  """The fenced code block that follows ``marker`` in the README."""
  text = README.read_text()
  start = text.index(marker)
  match = re.compile(r"```(\w*)\n(.*?)```", re.S).search(text, start)
  return match.group(2)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -r requirements-test.txt)")
  pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed")
  out = tmp_path_factory.mktemp("site")
  env = dict(os.environ, DISABLE_MKDOCS_2_WARNING="true", NO_MKDOCS_2_WARNING="1")
  proc = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
  return out


def _public_objects() -> set[str]:
  """Dotted paths of every function and class a public module of dml_jax defines or takes
  from one of its package's private modules (``evaluation.knn.nearest_neighbors``), and of the
  builders a package's private modules register (``objectives._nca.nca``, reached as
  ``objectives.nca`` through the registry)."""
  import griffe  # pylint: disable=g-import-not-at-top
  package = griffe.load("dml_jax", search_paths=[str(ROOT)], resolve_aliases=True,
                        resolve_external=False)
  found = set()

  def visit(module):
    if any(part.startswith("_") for part in module.path.split(".")):
      return
    for name, member in module.members.items():
      if name.startswith("_"):
        continue
      if member.is_alias:
        try:
          target = member.final_target
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
          continue
        if not target.path.startswith("dml_jax."):
          continue
        private_home = any(p.startswith("_") for p in target.path.split("."))
        if not private_home or not (target.is_function or target.is_class):
          continue
        found.add(f"{module.path}.{name}")
      elif member.is_module:
        visit(member)
      elif member.is_function or member.is_class:
        found.add(member.path)
    for name, sub in module.members.items():   # builders registered by a private module
      if name.startswith("_") and not sub.is_alias and sub.is_module:
        found.update(m.path for m in sub.members.values()
                     if not m.is_alias and m.is_function and any(
                         str(d.value).split("(")[0].split(".")[-1] == "register"
                         for d in m.decorators))

  visit(package)
  return found


def test_the_site_builds_strictly_and_documents_every_public_name(site):
  from mkdocstrings import Inventory  # pylint: disable=g-import-not-at-top
  with open(site / "objects.inv", "rb") as f:
    documented = set(Inventory.parse_sphinx(f))
  public = _public_objects()
  assert len(public) > 300, sorted(public)[:20]
  assert {"dml_jax.objectives.make", "dml_jax.objectives._nca.nca", "dml_jax.evaluation.knn.nearest_neighbors",
          "dml_jax.data.samplers.NPerClassSampler"} <= public
  missing = sorted(public - documented)
  assert not missing, f"not in the API reference: {missing}"


def test_every_docs_page_is_in_the_navigation():
  text = (ROOT / "mkdocs.yml").read_text()
  pages = {p.name for p in (ROOT / "docs").glob("*.md")}
  assert pages, "docs/ has no pages"
  unlisted = sorted(p for p in pages if p not in text)
  assert not unlisted, f"docs pages missing from mkdocs.yml's nav: {unlisted}"


def test_the_readme_library_example_runs():
  code = _readme_block("## The library in ten lines")
  assert len([l for l in code.splitlines() if l.strip()]) <= 13, code
  namespace = {}
  exec(compile(code, "README.md", "exec"), namespace)  # pylint: disable=exec-used
  assert float(namespace["loss"]) > 0 and namespace["aux"]["active_fraction"] >= 0


def test_the_package_metadata_agrees_with_the_requirements_and_the_docs():
  """pyproject's dependencies are requirements.txt's (what the docs install), its version is
  ``dml_jax.__version__``, and each ``jax[cudaNN]`` the docs name is an extra of the package."""
  import tomllib  # pylint: disable=import-outside-toplevel
  import dml_jax  # pylint: disable=import-outside-toplevel
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  lines = [l.split("#")[0].strip() for l in (ROOT / "requirements.txt").read_text().splitlines()]
  assert sorted(l for l in lines if l and l != "-e .") == sorted(project["dependencies"])
  assert project["version"] == dml_jax.__version__
  text = README.read_text() + (ROOT / "docs" / "getting-started.md").read_text()
  named = set(re.findall(r"jax\[(cuda\d+)\]", text))
  assert named, "the docs name no jax[cudaNN]"
  extras = project["optional-dependencies"]
  assert {n: extras.get(n) for n in named} == {n: [f"jax[{n}]"] for n in named}


def test_the_minimum_versions_file_pins_the_declared_floors():
  """requirements-min.txt (the oldest releases the suite was run on) pins exactly the floors of
  requirements.txt, one ``==`` per ``>=`` (``1.0`` and ``1.0.0`` alike), and jaxlib at jax's."""
  def parse(name, op):
    out = {}
    for line in (ROOT / name).read_text().splitlines():
      line = line.split("#")[0].strip()
      if line and line != "-e .":
        package, _, version = line.partition(op)
        assert version, f"{name}: {line!r} is not PACKAGE{op}VERSION"
        release = [int(n) for n in version.strip().split(".")]
        while release and release[-1] == 0:
          release.pop()
        out[re.sub(r"[-_.]+", "-", package.strip().lower())] = tuple(release)
    return out
  floors, pins = parse("requirements.txt", ">="), parse("requirements-min.txt", "==")
  assert pins.pop("jaxlib") == pins["jax"]
  assert pins == floors


def test_the_readme_is_short():
  lines = README.read_text().count("\n")
  assert lines <= 210, f"README.md has {lines} lines; the details belong in docs/"


def test_rest_habits_become_markdown():
  pytest.importorskip("griffe", reason="griffe is not installed (pip install -r requirements-test.txt)")
  sys.path.insert(0, str(ROOT / "docs"))
  try:
    import griffe_rest  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(str(ROOT / "docs"))
  text = ("Usage::\n\n  python -m tool [--a=1] [--b=2]\n\nSee :func:`make`.\n\n"
          "Args:\n  x: ``[B, D]``.\n\n  y: more.\n")
  assert griffe_rest.to_markdown(text) == (
      "Usage:\n\n```text\npython -m tool [--a=1] [--b=2]\n```\n\nSee ``make``.\n\n"
      "Args:\n  x: ``[B, D]``.\n\n  y: more.\n")
  assert griffe_rest.to_markdown("Run\n\n  cmd --x\n\nthen") == "Run\n\n```text\ncmd --x\n```\n\nthen"


def test_the_options_the_departures_table_names_exist():
  """Every ``--config.KEY=VALUE`` of docs/papers.md is a config key (``loss.*``: a
  hyper-parameter of some objective) and every ``optimizer.*`` / ``data.*`` key it quotes is
  in the schema."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from dml_jax import objectives  # pylint: disable=g-import-not-at-top
  text = (ROOT / "docs" / "papers.md").read_text()
  table = text[text.index("## Departures from the papers"):]
  config = default.get_config()
  hparams = {k for name in objectives.names() for k in objectives.hparam_defaults(name)}
  keys = set(re.findall(r"--config\.([a-z_.]+)=", table))
  keys |= set(re.findall(r"`((?:optimizer|data)\.[a-z_]+)", table))
  assert {"loss.positive", "data.small_class", "optimizer.weight_decay_mode"} <= keys
  for key in sorted(keys):
    group, _, name = key.partition(".")
    if group == "loss":
      assert name in hparams, f"docs/papers.md names loss.{name}, which no objective takes"
    else:
      assert name in config[group], f"docs/papers.md names {key}, not a config key"


def _documented_commands() -> list[tuple[str, str]]:
  """``(where, command)`` of every ``python ...`` command of the README, docs/*.md,
  benchmarks/README.md (fenced blocks and inline code) and the docstrings of configs/*.py and
  experiments/*.py, with line continuations joined and comments dropped."""
  import ast  # pylint: disable=g-import-not-at-top
  texts = [(p, p.read_text()) for p in
           [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
  texts += [(p, ast.get_docstring(ast.parse(p.read_text())) or "") for p in
            sorted([*(ROOT / "configs").glob("*.py"), *(ROOT / "experiments").glob("*.py")])]
  found = []
  for path, text in texts:
    chunks = [m.group(1) for m in re.finditer(r"```\w*\n(.*?)```", text, re.S)]
    chunks += re.findall(r"`([^`\n]*python3? [^`\n]*)`", text)
    if path.suffix == ".py":
      chunks.append(text)
    for chunk in chunks:
      for line in re.sub(r"\\\n\s*", " ", chunk).splitlines():
        for part in re.split(r"\s*(?:&&|;)\s*", re.sub(r"\s+#.*$", "", line)):
          if re.match(r"(?:\S+=\S+ )*python3? ", part.strip()):
            found.append((path.relative_to(ROOT).as_posix(), part.strip()))
  return found


def _tokens(command: str) -> list[str]:
  import shlex  # pylint: disable=g-import-not-at-top
  try:
    return shlex.split(command)
  except ValueError:
    return command.split()


_PLACEHOLDER = re.compile(r"\.\.\.|\b(?:NAME|ROW|X|ARCH|KIND|W|K|N|DIR|FILE|L)\b|<")


def test_every_documented_config_spec_and_key_exists():
  """Each ``--config=FILE[:variant]`` of a documented command resolves, and each key it sets
  (``--config.KEY=``, the sweep's ``--set KEY=`` and ``--grid KEY=``) is a key of that config
  (``loss.*``: a hyper-parameter of the objective it trains); placeholders (``NAME``, ``ROW``,
  ``...``) and commands with a user ``--module`` are left out."""
  from dml_jax import objectives  # pylint: disable=g-import-not-at-top
  from dml_jax.run import config as config_lib  # pylint: disable=g-import-not-at-top
  checked = 0
  for where, command in _documented_commands():
    tokens = _tokens(command)
    specs = [t.split("=", 1)[1] for t in tokens if t.startswith("--config=")]
    if not specs or _PLACEHOLDER.search(specs[0]) or any(t.startswith("--module") for t in tokens):
      continue
    spec = specs[0]
    config = config_lib.resolve(os.path.join(ROOT, spec))
    keys = [t[len("--config."):].split("=", 1)[0] for t in tokens if t.startswith("--config.")]
    for i, t in enumerate(tokens):
      value = t[len("--set="):] if t.startswith("--set=") else (
          tokens[i + 1] if t in ("--set", "--grid") and i + 1 < len(tokens) else
          t[len("--grid="):] if t.startswith("--grid=") else None)
      if value is not None:
        keys += value.split("=", 1)[0].split("+")
    flat = config_lib.flatten(config)
    name = dict(t[len("--config."):].split("=", 1) for t in tokens
                if t.startswith("--config.loss.name=")).get("loss.name", config.loss.name)
    for key in keys:
      if key.startswith("loss."):
        assert key == "loss.name" or key[5:] in objectives.hparam_defaults(name), (
            f"{where}: {command!r} sets {key}, which objective {name!r} does not take")
      else:
        assert key in flat or key.startswith("data.options."), (
            f"{where}: {command!r} sets {key}, not a key of {spec}")
    checked += 1
  assert checked > 40, checked


def _flag_names(*command: str) -> set[str]:
  """The flag names a binary's ``--helpfull`` / ``--help`` lists (``--[no]x``: both)."""
  proc = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, check=False)
  names = set()
  for negatable, name in re.findall(r"--(\[no\])?([A-Za-z_][\w-]*)", proc.stdout + proc.stderr):
    names |= {name, "no" + name} if negatable else {name}
  assert "workdir" in names, proc.stdout + proc.stderr
  return names


@pytest.mark.slow
def test_every_documented_flag_of_the_binaries_exists():
  """Every ``--flag`` of a documented ``train.py``, ``eval.py`` or sweep command is one the
  binary defines (``--config.*`` overrides: the test above)."""
  binaries = {"train.py": ("train.py", "--helpfull"), "eval.py": ("eval.py", "--helpfull"),
              "dml_jax.run.experiments": ("-m", "dml_jax.run.experiments", "sweep", "--help")}
  known = {name: _flag_names(*argv) for name, argv in binaries.items()}
  checked = 0
  for where, command in _documented_commands():
    tokens = _tokens(command)
    start = next((i for i, t in enumerate(tokens) if re.fullmatch(r"python3?", t)), None)
    program = tokens[start + 1:start + 3] if start is not None else []
    binary = (program[0] if program[:1] in (["train.py"], ["eval.py"]) else
              program[1] if program == ["-m", "dml_jax.run.experiments"] else None)
    if binary is None:
      continue
    for t in tokens[start + 1:]:
      name = t[2:].split("=", 1)[0].strip("\"'")   # a command inside quotes (gcloud --command)
      if t.startswith("--") and not name.startswith("config."):
        assert name in known[binary], f"{where}: {command!r}: {binary} has no flag --{name}"
    checked += 1
  assert checked > 40, checked


def test_each_config_docstring_says_what_its_commands_need():
  """A config's documented command runs once its data and weights are there: the docstring
  names the converted weights file its default row loads and, for data that is not built in
  (the digits), where the data comes from (docs/datasets.md or a ``data.options`` path)."""
  import ast  # pylint: disable=g-import-not-at-top
  from dml_jax.run import config as config_lib  # pylint: disable=g-import-not-at-top
  built_in = {"digits", "digits_evenodd", "digits_png"}
  for path in sorted((ROOT / "configs").glob("*.py")):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    if "python train.py" not in doc:
      continue
    config = config_lib.resolve(str(path))
    if config.model.pretrained:
      assert config.model.pretrained in doc, f"{path.name}: needs {config.model.pretrained}"
    if config.data.name not in built_in:
      assert re.search(r"datasets\.md|data\.options\.(root|path)", doc), (
          f"{path.name}: says not where its data ({config.data.name}) comes from")


def test_objective_table_defaults_are_the_objectives_defaults():
  """Every ``key=value`` of the defaults column of docs/objectives.md's objective table is that
  objective's default (the papers' values quoted there)."""
  from dml_jax import objectives  # pylint: disable=g-import-not-at-top
  text = (ROOT / "docs" / "objectives.md").read_text()
  rows = re.findall(r"^\| `(\w+)` \|.*\| ([^|]*) \|$", text[:text.index("### Choosing")], re.M)
  assert sorted(name for name, _ in rows) == sorted(objectives.names())
  for name, cell in rows:
    defaults = objectives.hparam_defaults(name)
    for part in cell.split(", "):
      if part.startswith("as `"):
        continue
      *keys, value = part.split("=")
      value = value.strip("`")
      value = {"True": True, "False": False}.get(value, value)
      if isinstance(value, str) and re.fullmatch(r"-?[\d.]+", value):
        value = float(value)
      for key in keys:
        assert key in defaults and defaults[key] == value, (name, key, value, defaults.get(key))
