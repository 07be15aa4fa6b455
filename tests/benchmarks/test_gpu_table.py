"""The GPU tables of docs/performance.md (the ``gpu`` block of docs/tables.py, checked against
the page by tests/test_docs_tables.py) state their stamp and the Omniglot rows."""

from dml_test_support import load_device_script


def test_the_tables_state_the_stamp_and_the_omniglot_rows():
  block = load_device_script("gpu_table").generate()
  assert "NVIDIA H200, JAX 0.11.2" in block and "commit `" in block
  assert "| Trip. + SH |" in block and "| EPS + Trip. + SH |" in block
