"""benchmarks/profiling/op_profile.py: the ops of a profiled objective, with their shapes and
origins."""

from dml_jax import kernels
from dml_test_support import load_benchmark

bench = load_benchmark("profiling.op_profile")


def test_profile_names_the_objectives_ops():
  report = bench.profile("softtriple", batch_size=32, dim=16, per_class=4, calls=2)
  assert report["wall_ms_per_call"] > 0
  ops = report["ops"]
  assert ops == sorted(ops, key=lambda r: -r["ms_per_call"])
  origins = {r["from"] for r in ops}
  # the forward similarity matmul, and the soft pool's custom calls forward and backward where
  # its C++ kernel is available (XLA's ops, no custom call, where it is not)
  assert "jvp()/dot_general" in origins
  if kernels.load("soft_pool.cc") is not None:
    assert {"jvp()/ffi_call", "transpose(jvp())/ffi_call"} <= origins
  else:
    assert not any("ffi_call" in o for o in origins), origins
  assert all(r["count_per_call"] > 0 and r["shape"] for r in ops)


def test_profile_backbone_shows_the_convolution_kernels():
  report = bench.profile_backbone("small_cnn:8:4", calls=1)
  origins = " ".join(r["from"] for r in report["ops"])
  assert report["wall_ms_per_call"] > 0
  # the C++ convolutions where their kernel is available, else their matmul formulation
  if kernels.load("conv.cc") is not None:
    assert "ffi_call" in origins
  else:
    assert "ffi_call" not in origins and "dot_general" in origins, origins


def _meta(pid, name, tid=None):
  e = {"ph": "M", "pid": pid, "name": "thread_name" if tid is not None else "process_name",
       "args": {"name": name}}
  return {**e, "tid": tid} if tid is not None else e


def _op(pid, tid, name, ts, dur, hlo_op=None):
  return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur,
          "args": {"hlo_op": hlo_op or name}}


def test_op_events_prefers_the_device_planes_and_their_xla_ops_line():
  host = [_meta(1, "/host:CPU"), _meta(1, "python", tid=10), _op(1, 10, "fusion.1", 0, 5),
          {"ph": "X", "pid": 1, "tid": 10, "name": "PjitFunction", "ts": 0, "dur": 50}]
  # kernels on a stream, named by the kernel, carrying their HLO op
  streams = [_meta(2, "/device:GPU:0"), _meta(2, "Stream #7(Compute)", tid=7),
             _op(2, 7, "sm90_xmma_fprop_kernel", 10, 4, "cudnn-conv.3"),
             _op(2, 7, "loop_add_fusion", 14, 2, "fusion.1"),
             _op(2, 7, "sm90_xmma_dgrad_kernel", 16, 3, "cudnn-conv.3")]
  assert bench.op_events(host) == [host[2]]   # the CPU: the host's op events
  assert [e["args"]["hlo_op"] for e in bench.op_events(host + streams)] == [
      "cudnn-conv.3", "fusion.1", "cudnn-conv.3"]
  xla_ops = [_meta(2, "XLA Ops", tid=99), _op(2, 99, "cudnn-conv.3", 10, 9),
             _op(2, 99, "fusion.1", 19, 2)]
  assert [e["name"] for e in bench.op_events(host + streams + xla_ops)] == [
      "cudnn-conv.3", "fusion.1"]
  loop = [_op(2, 99, "while.4", 8, 20)]   # spans the two ops: only they count
  assert [e["name"] for e in bench.op_events(host + streams + xla_ops + loop)] == [
      "cudnn-conv.3", "fusion.1"]
  # kernels that carry their op only in an annotation; the module line is not an op
  annotated = [_meta(3, "/device:GPU:0"), _meta(3, "Stream #7(Compute)", tid=7),
               _meta(3, "XLA Modules", tid=5),
               {"ph": "X", "pid": 3, "tid": 5, "name": "jit_step(1)", "ts": 0, "dur": 40,
                "args": {"hlo_op": "jit_step"}},
               {"ph": "X", "pid": 3, "tid": 7, "name": "sm90_xmma_wgrad", "ts": 3, "dur": 6,
                "args": {"annotation": "cudnn-conv.7:#hlo_op=cudnn-conv.7,hlo_module=jit_step#"}}]
  assert [e["args"]["hlo_op"] for e in bench.op_events(host + annotated)] == ["cudnn-conv.7"]
  # no op named anywhere: the kernels under their own names
  bare = [_meta(4, "/device:GPU:0"), _meta(4, "Stream #7(Compute)", tid=7),
          {"ph": "X", "pid": 4, "tid": 7, "name": "sm90_xmma_fprop", "ts": 1, "dur": 2}]
  assert [e["args"]["hlo_op"] for e in bench.op_events(host + bare)] == ["sm90_xmma_fprop"]
  assert bench.busy_us(streams[2:] + [_op(2, 8, "x", 11, 10)]) == 11   # [10, 21): overlaps once
  assert bench.busy_us([]) == 0


def test_annotate_adds_shapes_kinds_and_rates():
  text = """
  %p.1 = bf16[8,16]{1,0} parameter(0)
  %p.2 = f32[16]{0} parameter(1)
  %fusion.3 = (f32[16]{0}, f32[16]{0}) fusion(%p.1, %p.2), kind=kInput, calls=%r
"""
  moved = 8 * 16 * 2 + 16 * 4 + 2 * 16 * 4
  rows = bench.annotate([{"op": "fusion.3", "ms_per_call": 0.001, "count_per_call": 2},
                         {"op": "missing", "ms_per_call": 1.0, "count_per_call": 1}], text)
  assert rows[0]["gb_per_s"] == (2 * moved) / (0.001 * 1e6)
  assert rows[0]["kind"] == "reduction fusion" and rows[1]["gb_per_s"] is None
  assert rows[0]["shape"] == "(f32[16]{0}, f32[16]{0})" and rows[1]["kind"] == "other"
