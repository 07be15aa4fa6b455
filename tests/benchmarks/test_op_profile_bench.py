"""benchmarks/profiling/op_profile.py: the ops of a profiled objective, with their shapes and
origins."""

from dml_test_support import load_benchmark

bench = load_benchmark("profiling.op_profile")


def test_profile_names_the_objectives_ops():
  report = bench.profile("softtriple", batch_size=32, dim=16, per_class=4, calls=2)
  assert report["wall_ms_per_call"] > 0
  ops = report["ops"]
  assert ops == sorted(ops, key=lambda r: -r["ms_per_call"])
  origins = {r["from"] for r in ops}
  # the forward similarity matmul and the soft pool's custom calls, forward and backward
  assert "jvp()/dot_general" in origins
  assert {"jvp()/ffi_call", "transpose(jvp())/ffi_call"} <= origins
  assert all(r["count_per_call"] > 0 and r["shape"] for r in ops)


def test_hlo_origins_parses_shapes_tuples_and_metadata():
  text = """
  %dot.1 = f32[8,4]{1,0} dot(%a, %b), metadata={op_name="jit(f)/jvp()/dot_general" x=1}
  ROOT %ffi_call.5 = (f32[2,3]{1,0}, f32[2]{0}) custom-call(%c), metadata={op_name="jit(f)/ffi_call"}
  %p = f32[3]{0} parameter(0)
"""
  assert bench.hlo_origins(text) == {"dot.1": ("f32[8,4]", "jvp()/dot_general"),
                                     "ffi_call.5": ("(f32[2,3], f32[2]{0})", "ffi_call"),
                                     "p": ("f32[3]{0}", "")}


def test_profile_backbone_shows_the_convolution_kernels():
  report = bench.profile_backbone("small_cnn:8:4", calls=1)
  origins = " ".join(r["from"] for r in report["ops"])
  assert report["wall_ms_per_call"] > 0 and "ffi_call" in origins   # the C++ convolutions
