"""Where the time goes: profiles of one call, run as ``python benchmarks/profiling/NAME.py``."""
