"""The objective registry: a name and hyper-parameters -> ``Objective(init, apply)``.

::

  obj = objectives.make("nca", positive="easy", negative="semihard")   # EPSHN
  params = obj.init(rng, num_classes=C, dim=D)                         # {} if parameter-free
  loss, aux = obj.apply(params, embeddings, labels, rng=rng)

``REGISTRY`` is a plain dict ``name -> builder``. A builder's keyword-only arguments *are* the
objective's hyper-parameters, with their defaults (config keys equal these argument names);
:func:`make` checks the given names against the builder's signature, fills in the defaults and
records all of them in ``Objective.hparams``. The builder validates the values and returns
``(init, apply)`` closures with the hyper-parameters baked in, so ``apply`` is ``jax.jit``-able
with nothing static to declare, and differentiable w.r.t. ``embeddings`` and ``params``.

Reference sets: by default the anchors of a batch are compared with the batch itself
(``S [B, B]``, self pairs excluded). ``apply(..., references=References(embeddings [N, D],
labels [N], mask [B, N]))`` compares them with ``N`` references instead (``S [B, N]``; ``mask``
says which pairs may count), what cross-batch memory (``dml_jax.memory``) passes: the batch
followed by earlier steps' embeddings. Every pair- and triplet-based objective accepts it; the
proxy / classification objectives raise ``ValueError``. With ``references = (embeddings,
labels, ~eye(B))`` every objective gives exactly its batch loss and gradient (tested). The
argument is optional, so a user's builder without it keeps working without memory.

Every ``apply`` composes ``similarity`` -> ``mining`` selections (under stop-gradient) -> a
``losses`` form per term -> ``losses.reduce`` over the valid terms (loss 0, finite gradients,
when no term is valid), and returns these float32 scalar diagnostics in ``aux``:

* ``'valid_fraction'``: fraction of anchors with at least one valid term (a positive and an
  admissible negative);
* ``'active_fraction'``: fraction of valid terms that are *active*. NCA losses:
  ``q = 1 - exp(-L) > 1e-3``, where ``q`` is the softmax weight of the negatives, which scales
  the term's whole gradient (``dL/dS_ap = -q/T`` for 1st order); triplet: ``L > 0`` (the hinge
  is open, else the gradient is exactly 0);
* ``'mean_s_ap'``, ``'mean_s_an'``: mean similarity ``S`` (not distance) of the selected
  positive / negative over valid terms; with ``negative='all'`` a term's ``S_an`` is the mean
  over its anchor's negatives. 0 when no term is valid.

The pair-based objectives (``contrastive``, ``binomial``, ``multi_similarity``,
``lifted_structure``, ``dro_*``) use pair selections and per-pair weights instead of
``mining.select``; their terms are pairs and their ``aux`` is defined in ``_pairs``.

Layout: one private module per family holds its builders and constants (``_nca``: nca,
nca_2nd; ``_triplet``: triplet, trimmed_triplet, margin; ``_proxy``: proxy_nca, proxy_anchor;
``_softmax``: normalized_softmax, cosface, arcface, subcenter_arcface, softtriple; ``_nce``: ntxent, supcon; ``_tuples``:
tuplet_margin, angular, npairs; ``_pairs``: contrastive, binomial, multi_similarity,
lifted_structure, circle, generalized_lifted_structure; ``_ranking``: fastap, ranked_list,
histogram, snr_contrastive; ``_dro``: dro_topk, dro_topk_pn,
dro_kl, dro_kl_grouped), ``_common`` the pieces they share; this package owns the registry. A new
objective = one builder in a family module + one line in ``REGISTRY`` + its test file.
Hyper-parameter checks: ``dml_jax.hparams``; reductions: ``losses.reduce``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import jax

# The family modules are private (``_nca``, ``_triplet``, ``_proxy``, ``_pairs``, ``_dro``, as
# optax's losses); their public names are this package's API (``objectives.nca``,
# ``objectives.PAIR_REDUCTIONS``, ...).
from dml_jax.objectives._common import PAIR_ACTIVE_WEIGHT
from dml_jax.objectives._common import References
from dml_jax.objectives._dro import DRO_KL_MODES
from dml_jax.objectives._dro import DRO_PAIR_LOSSES
from dml_jax.objectives._dro import dro_kl
from dml_jax.objectives._dro import dro_kl_grouped
from dml_jax.objectives._dro import dro_topk
from dml_jax.objectives._dro import dro_topk_pn
from dml_jax.objectives._nca import DUPLICATE_SIMILARITY
from dml_jax.objectives._nca import NCA_ACTIVE_WEIGHT
from dml_jax.objectives._nca import NCA_NEGATIVE_MODES
from dml_jax.objectives._nca import nca
from dml_jax.objectives._nca import nca_2nd
from dml_jax.objectives._pairs import MS_DUPLICATE_SIMILARITY
from dml_jax.objectives._pairs import PAIR_REDUCTIONS
from dml_jax.objectives._pairs import binomial
from dml_jax.objectives._pairs import contrastive
from dml_jax.objectives._pairs import lifted_structure
from dml_jax.objectives._pairs import multi_similarity
from dml_jax.objectives._proxy import PROXY_ACTIVE_WEIGHT
from dml_jax.objectives._proxy import proxy_anchor
from dml_jax.objectives._proxy import proxy_nca
from dml_jax.objectives._nce import ntxent
from dml_jax.objectives._nce import supcon
from dml_jax.objectives._pairs import circle
from dml_jax.objectives._pairs import generalized_lifted_structure
from dml_jax.objectives._ranking import fastap
from dml_jax.objectives._ranking import histogram
from dml_jax.objectives._ranking import ranked_list
from dml_jax.objectives._ranking import snr_contrastive
from dml_jax.objectives._tuples import angular
from dml_jax.objectives._tuples import npairs
from dml_jax.objectives._tuples import tuplet_margin
from dml_jax.objectives._softmax import SOFTMAX_ACTIVE_WEIGHT
from dml_jax.objectives._softmax import arcface
from dml_jax.objectives._softmax import cosface
from dml_jax.objectives._softmax import normalized_softmax
from dml_jax.objectives._softmax import softtriple
from dml_jax.objectives._softmax import subcenter_arcface
from dml_jax.objectives._triplet import MARGIN_BETA_MODES
from dml_jax.objectives._triplet import MARGIN_NEGATIVE_MODES
from dml_jax.objectives._triplet import MARGIN_REDUCTIONS
from dml_jax.objectives._triplet import TRIPLET_DISTANCES
from dml_jax.objectives._triplet import TRIPLET_MIN_SQ_DISTANCE
from dml_jax.objectives._triplet import TRIPLET_SIMILARITIES
from dml_jax.objectives._triplet import margin
from dml_jax.objectives._triplet import trimmed_triplet
from dml_jax.objectives._triplet import triplet


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """A loss with its resolved hyper-parameters (immutable; hashed and compared by identity).

  Attributes:
    name: the registry name.
    hparams: every hyper-parameter of the builder, defaults included (JSON-serialisable).
    init: ``init(rng, *, num_classes, dim) -> params`` (``{}`` for parameter-free objectives).
    apply: ``apply(params, embeddings [B, D], labels [B], *, rng=None, references=None) ->
      (loss, aux)``; ``loss`` a float32 scalar, ``aux`` a dict of float32 scalars.
      ``references`` (:class:`References`, pair- and triplet-based objectives only) replaces
      the batch as the set the anchors are compared with (cross-batch memory).
  """
  name: str
  hparams: dict[str, Any]
  init: Callable[..., Any]
  apply: Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


REGISTRY: dict[str, Callable[..., tuple[Callable, Callable]]] = {
    "nca": nca,
    "nca_2nd": nca_2nd,
    "triplet": triplet,
    "margin": margin,
    "proxy_nca": proxy_nca,
    "trimmed_triplet": trimmed_triplet,
    "contrastive": contrastive,
    "multi_similarity": multi_similarity,
    "lifted_structure": lifted_structure,
    "binomial": binomial,
    "dro_topk": dro_topk,
    "dro_topk_pn": dro_topk_pn,
    "dro_kl": dro_kl,
    "dro_kl_grouped": dro_kl_grouped,
    "proxy_anchor": proxy_anchor,
    "normalized_softmax": normalized_softmax,
    "cosface": cosface,
    "arcface": arcface,
    "ntxent": ntxent,
    "supcon": supcon,
    "circle": circle,
    "generalized_lifted_structure": generalized_lifted_structure,
    "tuplet_margin": tuplet_margin,
    "angular": angular,
    "npairs": npairs,
    "subcenter_arcface": subcenter_arcface,
    "softtriple": softtriple,
    "fastap": fastap,
    "ranked_list": ranked_list,
    "histogram": histogram,
    "snr_contrastive": snr_contrastive,
}


def register(name: str, builder: Callable | None = None):
  """Adds a user's objective to the registry, as ``register(name, builder)`` or as a decorator
  ``@register(name)`` over the builder.

  The builder follows the built-in ones: its keyword-only arguments (with defaults) are the
  hyper-parameters (``--config.loss.<arg>``), it validates them and returns ``(init, apply)``
  with ``init(rng, *, num_classes, dim) -> params`` and
  ``apply(params, embeddings [B, D], labels [B], *, rng=None) -> (loss, aux)``.
  ``train.py --module=M`` / ``config.user_modules`` import the module that registers it, so
  ``eval.py`` and the analysis tools find it too.

  Raises:
    ValueError: ``name`` is taken by another builder, or the builder has a positional or
      default-less parameter.
  """
  def add(fn: Callable) -> Callable:
    old = REGISTRY.get(name)
    same = old is None or (old.__module__, old.__qualname__) == (fn.__module__, fn.__qualname__)
    if not same:  # a module imported twice re-registers the same builder: fine
      raise ValueError(f"Objective {name!r} is already registered ({REGISTRY[name]!r}); "
                       "choose another name.")
    for p in inspect.signature(fn).parameters.values():
      if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
        raise ValueError(f"Objective builder {fn.__name__} for {name!r}: parameter {p.name!r} "
                         "must be keyword-only with a default (hyper-parameters are "
                         "config keys).")
    REGISTRY[name] = fn
    return fn

  return add if builder is None else add(builder)


def names() -> tuple[str, ...]:
  """The registered objective names, sorted."""
  return tuple(sorted(REGISTRY))


def hparam_defaults(name: str) -> dict[str, Any]:
  """The hyper-parameters of objective ``name`` with their defaults (its builder's keywords)."""
  if name not in REGISTRY:
    raise ValueError(f"Unknown objective {name!r}; available: {', '.join(names())}.")
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
  resolved.update(hparams)
  init, apply = REGISTRY[name](**resolved)
  return Objective(name=name, hparams=resolved, init=init, apply=apply)
