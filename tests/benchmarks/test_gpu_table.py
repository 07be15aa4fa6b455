"""The GPU tables of docs/performance.md (the ``gpu`` block of docs/tables.py, checked against
the page by tests/test_docs_tables.py) state their stamp and the Omniglot rows."""

from dml_test_support import load_device_script


def test_the_tables_state_the_stamp_and_the_omniglot_rows():
  block = load_device_script("gpu_table").generate()
  assert "NVIDIA H200, JAX 0.11.2" in block and "commit `" in block
  assert "| Trip. + SH |" in block and "| EPS + Trip. + SH |" in block


def _throughput_with_a_float32_row():
  """The committed throughput summary plus the float32 synthetic-only report that
  ``gpu_check.sh throughput`` also writes (no JPEG or cached input in that call)."""
  import copy  # pylint: disable=import-outside-toplevel
  gpu_table = load_device_script("gpu_table")
  tp = copy.deepcopy(gpu_table.load("throughput"))
  f32 = copy.deepcopy(tp["rows"][0])
  row = f32["results"][0]
  for key in ("real", "cached", "cache_build_s", "cache_gb", "loss"):
    row.pop(key, None)
  row.update(dtype="float32", synthetic=1000.0)
  tp["rows"].insert(1, f32)
  return gpu_table, tp


def test_a_synthetic_only_float32_row_renders_without_the_bf16_peer():
  gpu_table, tp = _throughput_with_a_float32_row()
  lines = gpu_table.checks_table(gpu_table.load("tests"), gpu_table.load("cross_platform"), tp)
  f32 = [line for line in lines if "float32" in line]
  assert len(f32) == 1
  assert "synthetic 1,000" in f32[0]
  # the peer runs bf16 autocast: no float32 row is compared with it
  assert "PyTorch" not in f32[0] and "torch.compile" not in f32[0]
  assert "JPEG" not in f32[0] and "cached" not in f32[0]
  bf16 = [line for line in lines if "bfloat16" in line]
  assert len(bf16) == 1 and "dml_jax / torch.compile 1.00×" in bf16[0]


def test_the_omniglot_rows_state_their_own_seed_count_and_an_unfinished_run():
  import copy  # pylint: disable=import-outside-toplevel
  gpu_table = load_device_script("gpu_table")
  om = copy.deepcopy(gpu_table.load("omniglot"))
  for metrics in om["rows"]["loss.positive=random"].values():
    metrics["n"] = 1   # one of its two seeds did not finish
  om["runs"][-1].update(finished=False, images_per_s=None)
  om["runs"][-1].pop("final_step")
  text = "\n".join(gpu_table.omniglot_table(om))
  assert "| Trip. + SH (1 seed) |" in text and "| EPS + Trip. + SH (2 seeds) |" in text
  assert "(2 seeds)" not in text.splitlines()[0]
  assert "1 of them unfinished" in text


def test_the_checks_name_the_model_sizes_and_stamps_their_summaries_hold():
  import copy  # pylint: disable=import-outside-toplevel
  gpu_table, tp = _throughput_with_a_float32_row()
  for report in tp["rows"][:2]:
    report["results"][0].update(model="resnet18", image_size=32)
  cross = copy.deepcopy(gpu_table.load("cross_platform"))
  cross.update(dim=8, num=600)
  cross["stamp"].update(commit="abc1234", date="2026-12-01")
  tests = gpu_table.load("tests")
  text = "\n".join(gpu_table.checks_table(tests, cross, tp))
  assert "ResNet-50" not in text and "ResNet-18 32 px bfloat16" in text
  assert "of 600 clustered 8-D embeddings" in text
  header = gpu_table.checks_header(tests, cross, tp)
  assert "cross: NVIDIA H200, JAX 0.11.2, 2026-12-01, commit `abc1234`" in header
  # the committed summaries: one stamp for the checks, and the text as before
  assert "cross:" not in gpu_table.checks_header(tests, gpu_table.load("cross_platform"), tp)
