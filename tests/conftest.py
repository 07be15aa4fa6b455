"""Shared test setup: 8 fake CPU devices, the repository root and tests/ on sys.path."""

import os
import sys

# Eight fake CPU devices for the whole session (multi-device tests); must precede JAX's
# backend initialisation, which happens lazily after this file is imported.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
for path in (ROOT, TESTS):
  if path not in sys.path:
    sys.path.insert(0, path)
