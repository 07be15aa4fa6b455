"""Mining: fixed-shape positive, negative and pair selections, computed under stop-gradient.

Every miner reads a score matrix ``s [B, N]`` where *higher = closer* (a similarity ``S`` for the
NCA losses, ``-d^2`` for distance losses) together with the boolean label masks of
``similarity.label_masks`` (``N = B`` for a batch against itself). Scores are wrapped in
``jax.lax.stop_gradient``: the miners choose *which* terms exist; gradients flow only through the
selected similarities, which the objectives gather from the differentiable ``S``.

Representation
--------------
A selection over ``B`` anchors is a :class:`Selection` of four ``[B, N]`` arrays, whatever the
modes (memory ``O(B N)``, never ``[B, N, N]``). One *term* is one selected (anchor, positive) pair
``(a, p)``:

* ``pairs[a, p]``   bool: ``(a, p)`` is a selected anchor-positive pair (``positive='easy'``,
  ``'hard'`` or ``'random'`` select at most one per row; ``'all'`` every positive).
* ``valid[a, p]``   bool: the term has its positive *and* a negative; only valid terms enter a
  loss. Anchors without a positive, or without an admissible negative, have no valid term.
* ``negative[a, p]`` int32: the index ``n`` of the negative of the term for the single-negative
  modes (it may depend on ``S_ap``, e.g. semi-hard). For ``negative='all'`` it holds the
  anchor's hardest negative (for diagnostics). Where ``valid`` is False it is an arbitrary
  in-range index.
* ``negatives[a, n]`` bool: the anchor's candidate negatives; a ``negative='all'`` loss sums
  over them.

Layout: ``triplets`` (:class:`Selection`, positive and negative modes, :func:`select`),
``distance_weighted`` (Wu et al.'s sampling), ``trimming`` (:func:`keep_easiest`), ``pairs``
(pair selections); this package re-exports their public names.

Modes
-----
See ``triplets`` for the positive and negative modes.

Pair selections (pair-based objectives: every ordered pair ``(i, j)``, ``i != j``, is a term):
multi-similarity mining (:func:`multi_similarity_pairs`), DRO top-K / top-K-PN
(:func:`topk_pairs`), DRO-KL weights (:func:`kl_weights`, :func:`kl_grouped_weights`) and
samples (:func:`kl_sample_pairs`) return fixed-shape ``[B, N]`` masks, weights or counts; see
``pairs``.
"""


from dml_jax.mining.distance_weighted import DW_FALLBACKS
from dml_jax.mining.distance_weighted import DW_NO_CUTOFF
from dml_jax.mining.distance_weighted import check_distance_weighted
from dml_jax.mining.distance_weighted import distance_weighted_negatives
from dml_jax.mining.distance_weighted import distance_weights
from dml_jax.mining.pairs import MS_NEGATIVE_MODES
from dml_jax.mining.pairs import MS_NEGATIVE_REFERENCES
from dml_jax.mining.pairs import MS_POSITIVE_MODES
from dml_jax.mining.pairs import kl_grouped_weights
from dml_jax.mining.pairs import kl_sample_pairs
from dml_jax.mining.pairs import kl_weights
from dml_jax.mining.pairs import multi_similarity_pairs
from dml_jax.mining.pairs import topk_pairs
from dml_jax.mining.trimming import keep_easiest
from dml_jax.mining.triplets import MARGIN_MODES
from dml_jax.mining.triplets import NEGATIVE_MODES
from dml_jax.mining.triplets import PER_ANCHOR_NEGATIVE_MODES
from dml_jax.mining.triplets import POSITIVE_MODES
from dml_jax.mining.triplets import STOCHASTIC_NEGATIVE_MODES
from dml_jax.mining.triplets import STOCHASTIC_POSITIVE_MODES
from dml_jax.mining.triplets import Selection
from dml_jax.mining.triplets import check_negative_mode
from dml_jax.mining.triplets import check_positive_mode
from dml_jax.mining.triplets import is_stochastic
from dml_jax.mining.triplets import negatives
from dml_jax.mining.triplets import negatives_per_anchor
from dml_jax.mining.triplets import pairs_from_index
from dml_jax.mining.triplets import positive_pairs
from dml_jax.mining.triplets import positives
from dml_jax.mining.triplets import select
