"""benchmarks/hlo.py: an HLO op's shape, origin, kind and bytes, and a compiled program's
kernels."""

import jax
import jax.numpy as jnp

from dml_test_support import load_benchmark

hlo = load_benchmark("hlo")


def test_definitions_and_origins_parse_shapes_tuples_and_metadata():
  text = """
  %dot.1 = f32[8,4]{1,0} dot(%a, %b), metadata={op_name="jit(f)/jvp()/dot_general" x=1}
  ROOT %ffi_call.5 = (f32[2,3]{1,0}, f32[2]{0}) custom-call(%c), metadata={op_name="jit(f)/ffi_call"}
  %p = f32[3]{0} parameter(0)
"""
  definitions = hlo.hlo_definitions(text)
  assert {name: (shape, hlo.origin(line)) for name, (shape, line) in definitions.items()} == {
      "dot.1": ("f32[8,4]{1,0}", "jvp()/dot_general"),
      "ffi_call.5": ("(f32[2,3]{1,0}, f32[2]{0})", "ffi_call"),
      "p": ("f32[3]{0}", "")}


def test_op_kind_reads_gpu_and_cpu_hlo_lines():
  lines = {
      '%cudnn-conv.3 = (bf16[256,56,56,64]{3,2,1,0}, u8[0]{0}) custom-call(%p, %w), '
      'window={size=3x3 pad=1_1x1_1}, custom_call_target="__cudnn$convForward"':
          "convolution (forward)",
      '%cudnn-conv-bw-input.2 = (bf16[256,56,56,64]{3,2,1,0}, u8[0]{0}) custom-call(%g, %w), '
      'custom_call_target="__cudnn$convBackwardInput"': "convolution (input gradient)",
      '%cudnn-conv-bw-filter.1 = (bf16[3,3,64,64]{3,2,1,0}, u8[0]{0}) custom-call(%x, %g), '
      'custom_call_target="__cudnn$convBackwardFilter"': "convolution (weight gradient)",
      '%convolution.4 = f32[8,4,4,16]{3,2,1,0} convolution(%x, %w)': "convolution (forward)",
      '%custom-call.4 = (bf16[256,512]{1,0}, s8[4194304]{0}) custom-call(%a, %b), '
      'custom_call_target="__cublas$lt$matmul"': "matmul",
      '%dot.1 = f32[8,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}': "matmul",
      '%input_reduce_fusion.3 = (f32[64]{0}, f32[64]{0}) fusion(%p), kind=kInput, '
      'calls=%fused_reduce': "reduction fusion",
      'ROOT %loop_add_fusion = bf16[256,56,56,256]{3,2,1,0} fusion(%a, %b), kind=kLoop, '
      'calls=%fused_add': "elementwise fusion",
      '%gemm_fusion_dot.2 = bf16[256,512]{1,0} fusion(%a, %b), kind=kCustom, calls=%g, '
      'backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}': "matmul",
      '%triton_softmax.1 = f32[256,256]{1,0} fusion(%s), kind=kCustom, calls=%t, '
      'backend_config={"fusion_backend_config":{"kind":"__triton"}}': "other",
      '%copy.5 = f32[3,3,64,64]{1,0,3,2} copy(%w)': "copy / transpose",
      '%reduce.2 = f32[64]{0} reduce(%x, %z), dimensions={0,1,2}, to_apply=%add':
          "reduction fusion",
      '%select-and-scatter.1 = bf16[256,112,112,64]{3,2,1,0} select-and-scatter(%x, %g, %z)':
          "other",
      '%ffi_call.5 = (f32[2,3]{1,0}) custom-call(%c), custom_call_target="dml_conv"': "other",
  }
  for line, kind in lines.items():
    assert hlo.op_kind(line) == kind, line
  assert set(lines.values()) <= set(hlo.KINDS)
  text = "\n".join("  " + line for line in lines)
  kinds = {name: hlo.op_kind(line) for name, (_, line) in hlo.hlo_definitions(text).items()}
  assert kinds["cudnn-conv.3"] == "convolution (forward)" and kinds["copy.5"] == "copy / transpose"


def test_bytes_of_an_ops_operands_and_results():
  assert hlo.shape_bytes("bf16[256,56,56,64]{3,2,1,0}") == 2 * 256 * 56 * 56 * 64
  assert hlo.shape_bytes("(f32[64]{0}, pred[3], s8[2,2], f64[])") == 4 * 64 + 3 + 4 + 8
  assert hlo.shape_bytes("(bf16[4,4]{1,0}, u8[1024]{0})", scratch=False) == 32
  text = """
  %p.1 = bf16[8,16]{1,0} parameter(0)
  %p.2 = f32[16]{0} parameter(1)
  %fusion.3 = (f32[16]{0}, f32[16]{0}) fusion(%p.1, %p.2), kind=kInput, calls=%r
  %cudnn-conv.4 = (bf16[8,16]{1,0}, u8[4096]{0}) custom-call(%p.1), custom_call_target="__cudnn$convForward"
"""
  sizes = hlo.hlo_bytes(text)
  assert sizes["fusion.3"] == 8 * 16 * 2 + 16 * 4 + 2 * 16 * 4
  assert sizes["cudnn-conv.4"] == 2 * (8 * 16 * 2)   # the workspace is not moved data


PROGRAM = """
%fused_add (p0: bf16[8,16], p1: bf16[8,16]) -> bf16[8,16] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[8,16]{1,0} parameter(1)
  ROOT %add.9 = bf16[8,16]{1,0} add(%p0, %p1)
}

ENTRY %main.7 (x: bf16[8,16], s: f32[16]) -> (bf16[8,16], f32[16]) {
  %x = bf16[8,16]{1,0} parameter(0)
  %s = f32[16]{0} parameter(1)
  %cudnn-conv.4 = (bf16[8,16]{1,0}, u8[4096]{0}) custom-call(%x), custom_call_target="__cudnn$convForward", metadata={op_name="jit(f)/conv_general_dilated"}
  %get-tuple-element.5 = bf16[8,16]{1,0} get-tuple-element(%cudnn-conv.4), index=0
  %loop_add_fusion = bf16[8,16]{1,0} fusion(%get-tuple-element.5, %x), kind=kLoop, calls=%fused_add
  %copy.6 = f32[16]{0} copy(%s)
  ROOT %tuple.7 = (bf16[8,16]{1,0}, f32[16]{0}) tuple(%loop_add_fusion, %copy.6)
}
"""


def test_entry_kernels_are_the_entry_ops_that_run_work():
  kernels = hlo.entry_kernels(PROGRAM)
  assert [k["op"] for k in kernels] == ["cudnn-conv.4", "loop_add_fusion", "copy.6"]
  assert [k["kind"] for k in kernels] == ["convolution (forward)", "elementwise fusion",
                                          "copy / transpose"]
  assert [k["bytes"] for k in kernels] == [2 * 256, 3 * 256, 2 * 64]
  assert kernels[0]["from"] == "conv_general_dilated"
  summary = hlo.program_summary(PROGRAM)
  assert summary["kernels"] == 3 and summary["small_kernels"] == 3
  assert summary["gb"] == (2 * 256 + 3 * 256 + 2 * 64) / 1e9
  assert [k["kind"] for k in summary["kinds"]] == [
      "convolution (forward)", "elementwise fusion", "copy / transpose"]
  assert [k["kernels"] for k in summary["kinds"]] == [1, 1, 1]


def test_program_summary_of_a_compiled_program():
  x = jnp.ones((256, 512), jnp.float32)
  text = jax.jit(lambda x: jnp.sum(jnp.tanh(x @ x.T) * 2.0, 0)).lower(x).compile().as_text()
  summary = hlo.program_summary(text)
  assert {k["kind"] for k in summary["kinds"]} <= set(hlo.KINDS)
  assert 1 <= summary["kernels"] < len(hlo.hlo_definitions(text))   # fused ops are not kernels
  assert summary["kernels"] == sum(k["kernels"] for k in summary["kinds"])
  assert summary["gb"] >= (256 * 512 * 4 + 256 * 4) / 1e9   # x read, the result written
  assert abs(summary["gb"] - sum(k["gb"] for k in summary["kinds"])) < 1e-12
