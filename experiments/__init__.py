"""Reproduction drivers: scripts that train runs (or read the runs' workdirs) to reproduce a
paper's table or figure, run as ``python experiments/NAME.py``. The speed of the code is
measured under ``benchmarks/`` instead."""
