"""The objective registry: ``REGISTRY`` (name -> builder), what each objective supports
(``SUPPORT``), :func:`register`, :func:`make` and :class:`Objective`.

Its own module so that the family modules (and a user's file) can ``@register`` their builders
without importing the package that imports them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from typing import Any, Callable

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Support:
  """What an objective supports, declared when it is registered.

  Attributes:
    references: ``apply`` takes ``references=`` (a reference set, e.g. cross-batch memory).
    parameters: ``init`` may return learnable parameters (proxies, class weights, ``beta``).
    randomness: ``apply`` may draw random numbers (some hyper-parameters need ``rng``).
  """
  references: bool = False
  parameters: bool = False
  randomness: bool = False


REGISTRY: dict[str, Callable[..., tuple[Callable, Callable]]] = {}
SUPPORT: dict[str, Support] = {}


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """A loss with its resolved hyper-parameters (immutable; hashed and compared by identity).

  Attributes:
    name: the registry name.
    hparams: every hyper-parameter of the builder, defaults included (JSON-serialisable).
    init: ``init(rng, *, num_classes, dim) -> params`` (``{}`` for parameter-free objectives).
    apply: ``apply(params, embeddings [B, D], labels [B], *, rng=None, references=None) ->
      (loss, aux)``; ``loss`` a float32 scalar, ``aux`` a dict of float32 scalars.
      ``references`` (:class:`References`, where ``support.references``) replaces the batch
      as the set the anchors are compared with (cross-batch memory).
    support: what the objective supports (:class:`Support`).
  """
  name: str
  hparams: dict[str, Any]
  init: Callable[..., Any]
  apply: Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
  support: Support = Support()


def register(name: str, builder: Callable | None = None, *, references: bool = False,
             parameters: bool = False, randomness: bool = False):
  """Adds an objective to the registry, as a decorator ``@register(name, ...)`` over its
  builder or as ``register(name, builder, ...)``.

  The builder's keyword-only arguments (with defaults) are the hyper-parameters
  (``--config.loss.<arg>``); it validates them and returns ``(init, apply)`` with
  ``init(rng, *, num_classes, dim) -> params`` and ``apply(params, embeddings [B, D],
  labels [B], *, rng=None[, references=None]) -> (loss, aux)``. The keywords say what it
  supports (:class:`Support`): ``references=True`` only if ``apply`` takes ``references``.
  ``train.py --module=M`` / ``config.user_modules`` import a user's module that registers
  one, so ``eval.py`` and the analysis tools find it too.

  Raises:
    ValueError: ``name`` is already registered by another builder (the same file imported
      again replaces its builders: :func:`_reimported`), or the builder has a positional or
      default-less parameter.
  """
  support = Support(references=bool(references), parameters=bool(parameters),
                    randomness=bool(randomness))

  def add(fn: Callable) -> Callable:
    if name in REGISTRY and not _reimported(REGISTRY[name], fn):
      old = REGISTRY[name]
      raise ValueError(f"Objective {name!r} is already registered (by {_describe(old)} in "
                       f"{_source(old)}); choose another name.")
    for p in inspect.signature(fn).parameters.values():
      if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
        raise ValueError(f"Objective builder {getattr(_function(fn), '__name__', fn)} for "
                         f"{name!r}: parameter {p.name!r} "
                         "must be keyword-only with a default (hyper-parameters are "
                         "config keys).")
    REGISTRY[name] = fn
    SUPPORT[name] = support
    return fn

  return add if builder is None else add(builder)


def _function(fn: Callable) -> Callable:
  """The function a builder calls: ``fn`` itself, or the one a ``functools.partial`` wraps."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  return fn


def _describe(fn: Callable) -> str:
  """``module.qualname`` of a builder (of the function a ``functools.partial`` wraps)."""
  f = _function(fn)
  return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"


def _source(fn: Callable) -> str:
  """The file a builder (the function a ``functools.partial`` wraps) is defined in, its real
  path, or ``repr(fn)`` when it has no code."""
  code = getattr(_function(fn), "__code__", None)
  return os.path.realpath(code.co_filename) if code is not None else repr(fn)


def _reimported(old: Callable, new: Callable) -> bool:
  """``new`` is ``old``'s definition run again: another function of the same name from the
  same file (``importlib.reload`` of a user's module after editing it, or one file imported as
  a module name and as a ``.py`` path). It then replaces ``old``; a builder of another file
  (a built-in's name taken by accident) or the same function registered twice is refused."""
  return (new is not old and getattr(new, "__code__", None) is not None
          and getattr(old, "__qualname__", None) == getattr(new, "__qualname__", None)
          and _source(old) == _source(new))


def names() -> tuple[str, ...]:
  """The registered objective names, sorted."""
  return tuple(sorted(REGISTRY))


def support(name: str) -> Support:
  """What objective ``name`` supports (:class:`Support`)."""
  _check_name(name)
  return SUPPORT[name]


def _check_name(name: str) -> None:
  if name not in REGISTRY:
    raise ValueError(f"Unknown objective {name!r}; available: {', '.join(names())}.")


def hparam_defaults(name: str) -> dict[str, Any]:
  """The hyper-parameters of objective ``name`` with their defaults (its builder's keywords)."""
  _check_name(name)
  params = inspect.signature(REGISTRY[name]).parameters.values()
  return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def make(name: str, **hparams) -> Objective:
  """Builds the objective ``name`` with ``hparams`` (the rest at their defaults).

  Args:
    name: one of :func:`names`.
    **hparams: keyword arguments of the builder ``REGISTRY[name]``.

  Returns:
    :class:`Objective` with ``hparams`` holding every resolved hyper-parameter.

  Raises:
    ValueError: unknown ``name`` (lists the names), unknown hyper-parameter (lists the valid
      ones) or a bad value (e.g. ``temperature <= 0``, an unknown or unusable mining mode).
  """
  resolved = hparam_defaults(name)
  unknown = sorted(set(hparams) - set(resolved))
  if unknown:
    raise ValueError(f"Unknown hyper-parameter(s) {', '.join(unknown)} for objective {name!r}; "
                     f"valid: {', '.join(resolved)}.")
  # numpy scalars (a sweep over np.arange, an array's entry) as Python numbers: JSON-ready
  resolved.update({k: v.item() if isinstance(v, np.generic) else v for k, v in hparams.items()})
  built = REGISTRY[name](**resolved)
  if not (isinstance(built, tuple) and len(built) == 2 and all(map(callable, built))):
    raise ValueError(f"the builder of objective {name!r} must return (init, apply), two "
                     f"functions, got {type(built).__name__}; a parameter-free objective "
                     "returns (objectives.no_params, apply) (objectives.batch_objective returns "
                     "apply only).")
  init, apply = built
  return Objective(name=name, hparams=resolved, init=init, apply=apply, support=SUPPORT[name])
