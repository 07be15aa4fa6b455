"""Reading compiled HLO text: each op's shape, origin, kind and the bytes it moves, and a whole
program's kernels.

``jax.jit(f).lower(...).compile().as_text()`` is the program XLA runs: on a GPU, each op of
its entry computation that is not bookkeeping (a parameter, a tuple, a bitcast, a constant)
is a kernel launch or a library call (a fusion, a cuDNN convolution, a cuBLAS GEMM, a copy).
``profiling/op_profile.py`` sets a profile's times beside these ops; ``speed/
train_throughput.py --gpu_target`` summarises a program compiled for a GPU on a machine
without one (:func:`program_summary`).
"""

import collections
import re

import numpy as np

HLO_DEF = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) ")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_definitions(hlo_text: str) -> dict[str, tuple[str, str]]:
  """``{op name: (result shape, its line)}``: each op's first definition in HLO text."""
  out = {}
  for line in hlo_text.splitlines():
    definition = HLO_DEF.match(line)
    if definition:
      out.setdefault(definition.group(1), (definition.group(2), line))
  return out


def origin(line: str) -> str:
  """The JAX operation an HLO line comes from (its ``op_name`` less ``jit(...)/``)."""
  op_name = OP_NAME.search(line)
  return op_name.group(1).split("/", 1)[-1] if op_name else ""


KINDS = ("convolution (forward)", "convolution (input gradient)",
         "convolution (weight gradient)", "matmul", "reduction fusion", "elementwise fusion",
         "copy / transpose", "other")
_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')
_FUSION_KIND = re.compile(r"\bkind=(k\w+)")
# an HLO line's opcode and operand list: "%name = shape opcode(%a, %b), attributes"
_OPERATION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (?:\(.*?\)|\S+) ([\w\-]+)\(([^()]*)\)")


def op_kind(line: str) -> str:
  """The kind (one of ``KINDS``) of the op an HLO line defines: cuDNN's convolution custom
  calls by direction (a plain ``convolution``: forward), cuBLAS / Triton GEMMs and ``dot`` as
  matmuls, fusions by XLA's fusion kind (``kInput``: a reduction; ``kLoop``: elementwise;
  ``kOutput`` or a GEMM inside: a matmul), copies and transposes; anything else (a pooling
  window, a custom call of another target) is ``other``."""
  target = _CUSTOM_CALL.search(line)
  target = target.group(1) if target else ""
  operation = _OPERATION.match(line)
  opcode = operation.group(1) if operation else ""
  if "convBackwardInput" in target:
    return "convolution (input gradient)"
  if "convBackwardFilter" in target:
    return "convolution (weight gradient)"
  if "convForward" in target or "convBiasActivationForward" in target or opcode == "convolution":
    return "convolution (forward)"
  if opcode == "dot" or re.search(r"gemm|matmul|cublas", target):
    return "matmul"
  if opcode == "fusion":
    kind = _FUSION_KIND.search(line)
    kind = kind.group(1) if kind else ""
    if kind == "kInput":
      return "reduction fusion"
    if kind == "kLoop":
      return "elementwise fusion"
    if kind == "kOutput" or re.search(r"gemm|cudnn\$fusion|dot\(", line):
      return "matmul"
    return "other"
  if opcode in ("copy", "transpose", "copy-start", "copy-done"):
    return "copy / transpose"
  if opcode == "reduce":
    return "reduction fusion"
  return "other"


_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|f8\w*)\[([\d,]*)\]")


def shape_bytes(shape: str, *, scratch: bool = True) -> int:
  """Bytes of the arrays in an HLO shape (``bf16[256,56,56,64]{3,2,1,0}``, tuples summed);
  ``scratch=False`` leaves out ``u8`` arrays (a custom call's workspace)."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    if dtype == "u8" and not scratch:
      continue
    if dtype == "pred" or dtype.startswith("f8"):
      size = 1
    elif dtype == "bf16":
      size = 2
    else:   # s32, u8, f16, f64, ...: the bits in the name
      size = max(1, int(dtype[1:]) // 8)
    total += size * int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
  return total


def hlo_bytes(hlo_text: str) -> dict[str, int]:
  """``{op name: bytes its operands and results hold}`` for every op defined in ``hlo_text``:
  a lower bound on the memory an op moves (its operands read once, its results written once;
  a custom call's ``u8`` workspace left out)."""
  return op_bytes(hlo_definitions(hlo_text))


def op_bytes(definitions: dict[str, tuple[str, str]]) -> dict[str, int]:
  """:func:`hlo_bytes` of parsed definitions (:func:`hlo_definitions`)."""
  out = {}
  for name, (shape, line) in definitions.items():
    operation = _OPERATION.match(line)
    operands = re.findall(r"%([\w.\-]+)", operation.group(2)) if operation else []
    out[name] = (shape_bytes(shape, scratch=False)
                 + sum(shape_bytes(definitions.get(n, ("", ""))[0]) for n in operands))
  return out


# an entry computation's ops that launch nothing (views, bookkeeping)
_NO_KERNEL = frozenset({"parameter", "get-tuple-element", "tuple", "constant", "bitcast",
                        "after-all", "partition-id", "replica-id"})
SMALL_KERNEL_BYTES = 1 << 20


def entry_kernels(hlo_text: str) -> list[dict]:
  """``[{'op', 'kind', 'bytes', 'from'}]``: the ops of the ``ENTRY`` computation that run
  work, in program order, with :func:`op_kind`, :func:`hlo_bytes` and :func:`origin`."""
  definitions = hlo_definitions(hlo_text)
  sizes = op_bytes(definitions)
  out, inside = [], False
  for line in hlo_text.splitlines():
    if line.startswith("ENTRY "):
      inside = True
      continue
    if inside and line.startswith("}"):
      break
    operation = _OPERATION.match(line) if inside else None
    if operation and operation.group(1) not in _NO_KERNEL:
      name = HLO_DEF.match(line).group(1)
      out.append({"op": name, "kind": op_kind(line), "bytes": sizes[name],
                  "from": origin(line)})
  return out


def program_summary(hlo_text: str) -> dict:
  """What a compiled program runs: ``kernels`` (:func:`entry_kernels`), ``small_kernels``
  (those that move under ``SMALL_KERNEL_BYTES``, whose cost is mostly their launch),
  ``gb`` (the bytes all of them move, each operand read once and each result written once:
  a floor on the memory traffic), and ``kinds``: ``[{'kind', 'kernels', 'gb'}]`` in
  ``KINDS`` order (kinds with no kernel left out)."""
  kernels = entry_kernels(hlo_text)
  count, moved = collections.Counter(), collections.Counter()
  for k in kernels:
    count[k["kind"]] += 1
    moved[k["kind"]] += k["bytes"]
  return {"kernels": len(kernels),
          "small_kernels": sum(k["bytes"] < SMALL_KERNEL_BYTES for k in kernels),
          "gb": sum(moved.values()) / 1e9,
          "kinds": [{"kind": kind, "kernels": count[kind], "gb": moved[kind] / 1e9}
                    for kind in KINDS if count[kind]]}
