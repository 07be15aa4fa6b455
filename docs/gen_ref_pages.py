"""Writes the API reference: one page per public module of ``dml_jax``, found by walking the
package (run by mkdocs-gen-files at every build, so a moved or new module is picked up).

A module is public when no part of its dotted name starts with ``_``. The functions and classes
a module imports from a private module (``objectives.nca`` from ``objectives/_nca.py``) are
its own API: they are rendered on its page too (griffe finds them statically, importing
nothing), and so are the builders its private modules register with a ``@register(...)``
decorator (``objectives.nca``, defined and registered in ``objectives/_nca.py``, reached
through the registry). ``api/SUMMARY.md`` is the reference's navigation (literate-nav).
"""

from __future__ import annotations

import pathlib

import griffe
import mkdocs_gen_files

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dml_jax"


def module_name(path: pathlib.Path) -> tuple[str, ...]:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return parts[:-1] if parts[-1] == "__init__" else parts


def is_public(parts: tuple[str, ...]) -> bool:
  return not any(p.startswith("_") for p in parts)


def modules() -> list[tuple[str, ...]]:
  """The public modules of the package, as dotted-name parts, sorted."""
  found = {module_name(path) for path in PACKAGE.rglob("*.py")}
  return sorted(parts for parts in found if is_public(parts))


def private_reexports(module: griffe.Module) -> list[str]:
  """Public functions and classes ``module`` imports from a private module of the package."""
  names = []
  for name, member in module.members.items():
    if name.startswith("_") or not member.is_alias:
      continue
    try:
      target = member.final_target
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
      continue
    if (target.path.startswith("dml_jax.") and not is_public(tuple(target.path.split(".")))
        and (target.is_function or target.is_class)):
      names.append(name)
  return names


def registered(module: griffe.Module) -> list[str]:
  """Paths of the functions that ``module``'s private submodules decorate with ``register``."""
  paths = []
  for name, sub in module.members.items():
    if not name.startswith("_") or sub.is_alias or not sub.is_module:
      continue
    for member in sub.members.values():
      if not member.is_alias and member.is_function and any(
          str(d.value).split("(")[0].split(".")[-1] == "register" for d in member.decorators):
        paths.append(member.path)
  return paths


def main() -> None:
  package = griffe.load("dml_jax", search_paths=[str(ROOT)], resolve_aliases=True,
                        resolve_external=False)
  nav = mkdocs_gen_files.Nav()
  for parts in modules():
    name = ".".join(parts)
    doc = pathlib.Path("api", *parts).with_suffix(".md")
    nav[parts] = doc.relative_to("api").as_posix()
    module = package[".".join(parts[1:])] if len(parts) > 1 else package
    with mkdocs_gen_files.open(doc, "w") as f:
      f.write(f"# `{name}`\n\n::: {name}\n    options:\n      show_root_heading: false\n")
      for member in private_reexports(module):
        f.write(f"\n::: {name}.{member}\n")
      for path in registered(module):
        f.write(f"\n::: {path}\n    options:\n      show_root_full_path: false\n")
  with mkdocs_gen_files.open("api/SUMMARY.md", "w") as f:
    f.writelines(nav.build_literate_nav())


main()
