"""Benchmarks that time something: one script per subject, each run as
``python benchmarks/speed/NAME.py``."""
