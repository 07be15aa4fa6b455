"""benchmarks/speed/top_m_selection.py runs (the timing itself is a benchmark)."""

from dml_test_support import load_benchmark


def test_smoke_finds_the_same_neighbours_both_ways(capsys):
  assert load_benchmark("speed.top_m_selection").main(["--smoke"]) == 0
  out = capsys.readouterr().out
  assert "| 8 |" in out and "| 64 |" in out
