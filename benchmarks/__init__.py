"""The benchmarks: scripts in folders by kind (``speed/``, ``profiling/``, ``device/``), run as
``python benchmarks/KIND/NAME.py``, and the modules they share at this level (``harness``:
timing, the machine stamp, JSON and tables; the inputs, worker processes and cases that more
than one script uses). No script imports another script. See ``benchmarks/README.md``."""
