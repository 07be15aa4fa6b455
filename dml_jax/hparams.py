"""Hyper-parameter validation: one place for the checks every builder and miner makes.

Each check returns the value (converted to ``str`` / ``float`` / ``int`` / ``bool``) or raises
``ValueError`` naming the parameter, the bad value and what is allowed, e.g.::

  temperature = hparams.number("temperature", temperature, positive=True)
  hparams.choice("similarity", similarity, similarity_lib.KINDS)

Used by ``objectives``, ``mining`` and ``losses``; the messages are part of the API (tests and
users match them).
"""

from __future__ import annotations

import numbers


def is_integer(value) -> bool:
  """Whether ``value`` is an integer (anything with ``__index__``), not a ``bool``."""
  return not isinstance(value, bool) and hasattr(value, "__index__")


def is_real(value) -> bool:
  """Whether ``value`` is a real number (``numbers.Real``: ints, floats, numpy scalars), not a
  ``bool``; NaN and infinities included."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def choice(name: str, value, allowed) -> str:
  """``value`` if it is one of the strings ``allowed``.

  Raises:
    ValueError: ``"{name}={value!r} is not allowed; choose one of: a, b, c."``
  """
  if not isinstance(value, str) or value not in allowed:
    raise ValueError(f"{name}={value!r} is not allowed; choose one of: {', '.join(allowed)}.")
  return value


def mode(what: str, value, allowed) -> str:
  """``value`` if it is one of ``allowed``; the form of the library's lower-level functions.

  Raises:
    ValueError: ``"Unknown {what} {value!r}; allowed: a, b, c."`` (e.g. ``what='positive
      mode'``).
  """
  if value not in allowed:
    raise ValueError(f"Unknown {what} {value!r}; allowed: {', '.join(allowed)}.")
  return value


def number(name: str, value, *, positive: bool) -> float:
  """``float(value)`` for a finite real number ``> 0`` (``positive``) or ``>= 0``.

  Raises:
    ValueError: ``"{name} must be a number > 0, got {value!r}."`` (or ``>= 0``);
      ``"{name} must be a finite number > 0, got inf."`` for an infinity.
  """
  bound = "> 0" if positive else ">= 0"
  if not is_real(value) or not (value > 0 if positive else value >= 0):
    raise ValueError(f"{name} must be a number {bound}, got {value!r}.")
  if value == float("inf"):
    raise ValueError(f"{name} must be a finite number {bound}, got {value!r}.")
  return float(value)


def real(name: str, value, *, finite: bool = True) -> float:
  """``float(value)`` for a real number, finite unless ``finite=False``.

  Raises:
    ValueError: ``"{name} must be a finite number, got {value!r}."`` (``"a number"`` when
      ``finite=False``).
  """
  if not is_real(value) or (finite and not -float("inf") < value < float("inf")):
    raise ValueError(f"{name} must be a {'finite ' if finite else ''}number, got {value!r}.")
  return float(value)


def fraction(name: str, value) -> float:
  """``float(value)`` for a real number in ``(0, 1]``.

  Raises:
    ValueError: ``"{name} must be a number in (0, 1], got {value!r}."``
  """
  if not is_real(value) or not 0 < value <= 1:
    raise ValueError(f"{name} must be a number in (0, 1], got {value!r}.")
  return float(value)


def integer(name: str, value, *, minimum: int) -> int:
  """``int(value)`` for an integer ``>= minimum`` (not a ``bool``).

  Raises:
    ValueError: ``"{name} must be an int >= {minimum}, got {value!r}."``
  """
  if not is_integer(value) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
  return int(value)


def flag(name: str, value) -> bool:
  """``value`` if it is a ``bool``.

  Raises:
    ValueError: ``"{name} must be True or False, got {value!r}."``
  """
  if not isinstance(value, bool):
    raise ValueError(f"{name} must be True or False, got {value!r}.")
  return value


def positive_if_static(name: str, value):
  """``value``, checked ``> 0`` when it is a plain number (a traced or array value passes:
  the pure loss forms accept those).

  Raises:
    ValueError: ``"{name} must be > 0, got {value!r}."``
  """
  if isinstance(value, numbers.Real) and not value > 0:
    raise ValueError(f"{name} must be > 0, got {value!r}.")
  return value
