"""The GPU tables of docs/performance.md are generated from the committed GPU summaries."""

from dml_test_support import load_device_script


def test_the_performance_page_gpu_tables_equal_the_summaries():
  gpu_table = load_device_script("gpu_table")
  with open(gpu_table.PAGE) as f:
    text = f.read()
  assert gpu_table.replace_block(text, gpu_table.generate()) == text, (
      "docs/performance.md's GPU tables differ from docs/results/gpu/*.json: run "
      "python benchmarks/device/gpu_table.py --write")


def test_the_tables_state_the_stamp_and_the_omniglot_rows():
  block = load_device_script("gpu_table").generate()
  assert "NVIDIA H200, JAX 0.11.2" in block and "commit `" in block
  assert "| Trip. + SH |" in block and "| EPS + Trip. + SH |" in block
