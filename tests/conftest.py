"""Shared test setup: the repository root (configs/ is a package) and tests/ on sys.path."""

import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
for path in (ROOT, TESTS):
  if path not in sys.path:
    sys.path.insert(0, path)
