"""The objectives: a name and hyper-parameters -> ``Objective(init, apply)``.

::

  obj = objectives.make("nca", positive="easy", negative="semihard")   # EPSHN
  params = obj.init(rng, num_classes=C, dim=D)                         # {} if parameter-free
  loss, aux = obj.apply(params, embeddings, labels, rng=rng)

``REGISTRY`` is a plain dict ``name -> builder``, filled by ``@register(name, ...)`` where each
builder is defined. A builder's keyword-only arguments *are* the objective's hyper-parameters,
with their defaults (config keys equal these argument names); :func:`make` checks the given
names against the builder's signature, fills in the defaults and records all of them in
``Objective.hparams``. The builder validates the values and returns ``(init, apply)`` closures
with the hyper-parameters baked in, so ``apply`` is ``jax.jit``-able with nothing static to
declare, and differentiable w.r.t. ``embeddings`` and ``params``. ``objectives.<name>`` is the
builder registered as ``name`` (e.g. ``objectives.triplet``).

What an objective supports is declared when it registers (``Objective.support``,
:func:`support`, :class:`Support`): ``references`` (``apply`` takes a reference set),
``parameters`` (``init`` may return learnable parameters), ``randomness`` (some
hyper-parameters make ``apply`` draw random numbers: pass ``rng``). The trainer and the tests
read it (cross-batch memory needs ``references``; the tests run every registered objective).

Reference sets: by default the anchors of a batch are compared with the batch itself
(``S [B, B]``, self pairs excluded). ``apply(..., references=References(embeddings [N, D],
labels [N], mask [B, N]))`` compares them with ``N`` references instead (``S [B, N]``; ``mask``
says which pairs may count), what cross-batch memory (``dml_jax.memory``) passes: the batch
followed by earlier steps' embeddings. The pair- and triplet-based objectives accept it; the
proxy / classification objectives, ``npairs`` and ``histogram`` raise ``ValueError``. With
``references = (embeddings, labels, ~eye(B))`` every objective that supports them gives exactly
its batch loss and gradient (tested).

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
``lifted_structure``, ``dro_*``, ...) use pair selections and per-pair weights instead of
``mining.select``; their terms are pairs and their ``aux`` is defined in ``_pairs``.

Layout: ``_registry`` holds ``REGISTRY``, :func:`register`, :func:`make` and
:class:`Objective`; ``_common`` the shared ``apply`` preamble (:func:`_common.batch_objective`:
batch checks, the similarity kind and its check, the reference set, the ``rng`` check;
:func:`_common.pair_objective`: a pair objective as its term function; and
:func:`_common.class_objective` for the proxy / class-weight objectives) and the pieces the
families share. One private module per family registers its builders (``_nca``: nca, nca_2nd;
``_triplet``: triplet, trimmed_triplet, margin; ``_proxy``: proxy_nca, proxy_anchor;
``_softmax``: normalized_softmax, cosface, arcface, subcenter_arcface, softtriple,
large_margin_softmax, sphereface, p2sgrad; ``_nce``: ntxent, supcon; ``_tuples``: tuplet_margin,
angular, npairs; ``_pairs``: contrastive, binomial, multi_similarity, lifted_structure, circle,
generalized_lifted_structure, intra_pair_variance; ``_ranking``: fastap, ranked_list,
histogram, snr_contrastive, smooth_ap, pnp; ``_dro``: dro_topk, dro_topk_pn, dro_kl,
dro_kl_grouped); this package imports each family once.

A new objective = one builder with ``@register(name, ...)`` in a family module (or in a user's
file, imported with ``train.py --module``) + its test file; the tests that run every objective
(gradients, data parallelism, reference sets) pick it up from :func:`names`. A pair objective
is its term function plus its hyper-parameters::

  @objectives.register("sigmoid_pair", references=True)
  def sigmoid_pair(*, scale: float = 10.0, similarity: str = "cosine"):
    def terms(b):   # b: the batch's S [B, N] and label masks (objectives.Batch)
      fn = lambda s: jax.nn.softplus(scale * jnp.where(b.pos, -s, s))
      return objectives.PairTerms(fn, b.pos | b.neg, b.pos | b.neg, "mean")
    return objectives.pair_objective(terms, name="sigmoid_pair", similarity=similarity)

(``docs/extending.md`` walks through it.) Hyper-parameter checks: ``dml_jax.hparams``;
reductions: ``losses.reduce``.
"""

from __future__ import annotations

from typing import Any

# The family modules are private (as optax's losses) and register their builders on import;
# their public constants are this package's API (``objectives.PAIR_REDUCTIONS``, ...).
from dml_jax.objectives import _dro
from dml_jax.objectives import _nca
from dml_jax.objectives import _nce
from dml_jax.objectives import _pairs
from dml_jax.objectives import _proxy
from dml_jax.objectives import _ranking
from dml_jax.objectives import _softmax
from dml_jax.objectives import _triplet
from dml_jax.objectives import _tuples
from dml_jax.objectives._common import Batch
from dml_jax.objectives._common import PAIR_ACTIVE_WEIGHT
from dml_jax.objectives._common import PairTerms
from dml_jax.objectives._common import References
from dml_jax.objectives._common import batch_objective
from dml_jax.objectives._common import no_params
from dml_jax.objectives._common import pair_objective
from dml_jax.objectives._dro import DRO_KL_MODES
from dml_jax.objectives._dro import DRO_PAIR_LOSSES
from dml_jax.objectives._nca import DUPLICATE_SIMILARITY
from dml_jax.objectives._nca import NCA_ACTIVE_WEIGHT
from dml_jax.objectives._nca import NCA_NEGATIVE_MODES
from dml_jax.objectives._pairs import MS_DUPLICATE_SIMILARITY
from dml_jax.objectives._pairs import PAIR_REDUCTIONS
from dml_jax.objectives._proxy import PROXY_ACTIVE_WEIGHT
from dml_jax.objectives._ranking import PNP_VARIANTS
from dml_jax.objectives._registry import REGISTRY
from dml_jax.objectives._registry import Objective
from dml_jax.objectives._registry import Support
from dml_jax.objectives._registry import hparam_defaults
from dml_jax.objectives._registry import make
from dml_jax.objectives._registry import names
from dml_jax.objectives._registry import register
from dml_jax.objectives._registry import support
from dml_jax.objectives._softmax import SOFTMAX_ACTIVE_WEIGHT
from dml_jax.objectives._triplet import MARGIN_BETA_MODES
from dml_jax.objectives._triplet import MARGIN_NEGATIVE_MODES
from dml_jax.objectives._triplet import MARGIN_REDUCTIONS
from dml_jax.objectives._triplet import TRIPLET_DISTANCES
from dml_jax.objectives._triplet import TRIPLET_MIN_SQ_DISTANCE
from dml_jax.objectives._triplet import TRIPLET_SIMILARITIES

FAMILIES = (_dro, _nca, _nce, _pairs, _proxy, _ranking, _softmax, _triplet, _tuples)


def __getattr__(name: str) -> Any:
  """``objectives.<name>``: the builder registered as ``name`` (``objectives.triplet``)."""
  if name in REGISTRY:
    return REGISTRY[name]
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(REGISTRY))
