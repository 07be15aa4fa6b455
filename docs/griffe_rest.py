"""A griffe extension for the API reference: the package's docstrings are written with a few
reStructuredText habits that Markdown renders badly, so before mkdocstrings parses them

* a block indented under a line that ends in ``::``, or indented after a blank line outside a
  section (the usage lines of a command's module docstring), becomes a fenced code block;
* ``:func:`x``` and the other Sphinx roles become inline code.

The docstrings themselves stay plain text for ``help()``.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc):`~?([^`]+)`")
SECTION = re.compile(r"^(Args|Arguments|Returns|Yields|Raises|Attributes|Examples?|Notes?|"
                     r"Warns|Warnings|Parameters|Other Parameters|Keyword Args):\s*$")


def indent(line: str) -> int:
  return len(line) - len(line.lstrip(" "))


def to_markdown(text: str) -> str:
  lines = text.split("\n")
  out: list[str] = []
  in_section = False
  i = 0
  while i < len(lines):
    line = lines[i]
    if not line.strip():
      out.append(line)
      i += 1
      continue
    if indent(line) == 0:
      in_section = bool(SECTION.match(line))
    prev = out[-1] if out else ""
    after_colons = prev.rstrip().endswith("::") or (
        len(out) > 1 and not prev.strip() and out[-2].rstrip().endswith("::"))
    starts_block = indent(line) > 0 and (after_colons or (
        not prev.strip() and not in_section and not line.lstrip().startswith(("* ", "- "))))
    if not starts_block:
      out.append(ROLE.sub(r"``\1``", line))
      i += 1
      continue
    base = indent(line)
    block = []
    while i < len(lines) and (not lines[i].strip() or indent(lines[i]) >= base):
      block.append(lines[i][base:])
      i += 1
    while block and not block[-1].strip():
      block.pop()
    while out and not out[-1].strip():
      out.pop()
    if out and out[-1].strip() == "::":
      out.pop()
    elif out and out[-1].rstrip().endswith("::"):
      out[-1] = out[-1].rstrip()[:-1]
    out.append("")
    out += ["```text", *block, "```", ""]
  return "\n".join(out)


class RestToMarkdown(griffe.Extension):
  def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
    if obj.docstring is not None:
      obj.docstring.value = to_markdown(obj.docstring.value)
