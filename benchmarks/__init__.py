"""The benchmark scripts, run as ``python benchmarks/NAME.py``. A package only so that one
script can use another's pieces (``from benchmarks import train_step``)."""
