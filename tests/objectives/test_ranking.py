"""FastAP, ranked list, histogram, SNR-contrastive, Smooth-AP and PNP losses
(dml_jax/objectives/_ranking.py) against numpy loops over explicit pairs, bins and ranked lists:
values and gradients, bf16, one trace, no NaN without pairs."""

import functools
import math

import numpy as np
import pytest

import objective_support as support
from oracles import LABELS, fd_grad, np_similarity
from oracles import random_batch as batch

run = functools.partial(support.run, rng=None)


def _unit(e):
  e = np.asarray(e, np.float64)
  return e / np.linalg.norm(e, axis=1, keepdims=True)


def oracle_fastap(e, labels, num_bins):
  d2 = np.maximum(2 - 2 * np_similarity(e), 0)
  delta, out = 4.0 / num_bins, []
  for a in range(len(labels)):
    ps = [j for j in range(len(labels)) if j != a and labels[j] == labels[a]]
    if not ps:
      continue
    ns = [j for j in range(len(labels)) if labels[j] != labels[a]]
    pulse = lambda j, l: max(0.0, 1 - abs(d2[a, j] - l * delta) / delta)
    h_pos = [sum(pulse(j, l) for j in ps) for l in range(num_bins + 1)]
    h_all = [h_pos[l] + sum(pulse(j, l) for j in ns) for l in range(num_bins + 1)]
    ap = 0.0
    for l in range(num_bins + 1):
      num, den = h_pos[l] * sum(h_pos[:l + 1]), sum(h_all[:l + 1])
      if num > 0 and den > 0:
        ap += num / den
    out.append(1 - ap / len(ps))
  return float(np.mean(out))


def oracle_ranked_list(e, labels, margin, alpha, imbalance, tp, tn):
  d = np.sqrt(np.maximum(2 - 2 * np_similarity(e), 0))
  b, out = len(labels), []
  for a in range(b):
    wp = {j: math.exp(tp * (d[a, j] - (alpha - margin))) for j in range(b)
          if j != a and labels[j] == labels[a] and d[a, j] > alpha - margin}
    wn = {j: math.exp(tn * (alpha - d[a, j])) for j in range(b)
          if labels[j] != labels[a] and d[a, j] < alpha}
    lp = sum(w * (d[a, j] - (alpha - margin)) for j, w in wp.items()) / (sum(wp.values()) + b * 1e-5)
    ln = sum(w * (alpha - d[a, j]) for j, w in wn.items()) / (sum(wn.values()) + b * 1e-5)
    out.append((1 - imbalance) * lp + imbalance * ln)
  return float(np.mean(out))


def oracle_histogram(e, labels, num_bins):
  s, b, delta = np_similarity(e), len(labels), 2.0 / num_bins
  has_pos = [any(labels[j] == labels[i] for j in range(b) if j != i) for i in range(b)]
  has_neg = [any(labels[j] != labels[i] for j in range(b)) for i in range(b)]
  pp = [s[i, j] for i in range(b) for j in range(i + 1, b) if labels[i] == labels[j] and has_neg[i]]
  nn = [s[i, j] for i in range(b) for j in range(i + 1, b)
        if labels[i] != labels[j] and (has_pos[i] or has_pos[j])]

  def density(values):
    h = np.zeros(num_bins + 1)
    for v in values:
      r = min(int(math.floor((v + 1) / delta)), num_bins - 1)
      h[r + 1] += (v + 1 - r * delta) / delta
      h[r] += ((r + 1) * delta - 1 - v) / delta
    return h / len(values)

  return float(np.sum(density(nn) * np.cumsum(density(pp))))


def oracle_snr(e, labels, pos_margin, neg_margin):
  x, b = _unit(e), len(labels)
  pos_terms, neg_terms = [], []
  for a in range(b):
    for j in range(b):
      if j == a:
        continue
      d = np.var(x[j] - x[a]) / np.var(x[a])
      if labels[j] == labels[a]:
        pos_terms.append(max(d - pos_margin, 0))
      else:
        neg_terms.append(max(neg_margin - d, 0))
  mean_nonzero = lambda v: np.mean([t for t in v if t > 0]) if any(t > 0 for t in v) else 0.0
  return float(mean_nonzero(pos_terms) + mean_nonzero(neg_terms))


def _sigmoid(t):
  return 1.0 / (1.0 + math.exp(-t))


def _ranked_lists(labels, a, include_query):
  """Anchor ``a``'s ranked items (its positives, itself with ``include_query``; none without a
  positive) and its retrieval set (every item but itself, or every item)."""
  b = len(labels)
  if not any(labels[j] == labels[a] for j in range(b) if j != a):
    return [], []
  ranked = [j for j in range(b) if labels[j] == labels[a] and (include_query or j != a)]
  return ranked, [j for j in range(b) if include_query or j != a]


def oracle_smooth_ap(e, labels, temperature, include_query):
  s, out = np_similarity(e), []
  for a in range(len(labels)):
    ranked, omega = _ranked_lists(labels, a, include_query)
    if not ranked:
      continue
    ap = 0.0
    for p in ranked:
      ahead = lambda js: sum(_sigmoid((s[a, j] - s[a, p]) / temperature) for j in js if j != p)
      ap += (1 + ahead(ranked)) / (1 + ahead(omega))
    out.append(1 - ap / len(ranked))
  return float(np.mean(out))


def oracle_pnp(e, labels, variant, temperature, alpha, b, include_query):
  s, out = np_similarity(e), []
  f = {"O": lambda r: r, "Ds": lambda r: math.log(1 + r),
       "Dq": lambda r: 1 - (1 + r) ** -alpha, "Iu": lambda r: (1 + r) * math.log(1 + r),
       "Ib": lambda r: (b * r - math.log(1 + b * r)) / b ** 2}[variant]
  for a in range(len(labels)):
    ranked, _ = _ranked_lists(labels, a, include_query)
    if not ranked:
      continue
    negatives = [n for n in range(len(labels)) if labels[n] != labels[a]]
    r = [sum(_sigmoid((s[a, n] - s[a, p]) / temperature) for n in negatives) for p in ranked]
    out.append(np.mean([f(x) for x in r]))
  return float(np.mean(out))


CASES = [("smooth_ap", {"temperature": 0.01, "include_query": True}, oracle_smooth_ap),
         ("smooth_ap", {"temperature": 0.1, "include_query": False}, oracle_smooth_ap),
         *[("pnp", {"variant": v, "temperature": 0.05, "alpha": 2.0, "b": 3.0,
                    "include_query": q}, oracle_pnp)
           for v, q in (("O", True), ("Ds", False), ("Dq", True), ("Iu", True), ("Ib", False))],
         ("fastap", {"num_bins": 10}, oracle_fastap),
         ("fastap", {"num_bins": 3}, oracle_fastap),
         ("ranked_list", {"margin": 0.4, "alpha": 1.2, "imbalance": 0.5, "tp": 0.0, "tn": 10.0},
          oracle_ranked_list),
         ("ranked_list", {"margin": 0.3, "alpha": 1.1, "imbalance": 0.2, "tp": 2.0, "tn": 3.0},
          oracle_ranked_list),
         ("histogram", {"num_bins": 100}, oracle_histogram),
         ("histogram", {"num_bins": 7}, oracle_histogram),
         ("snr_contrastive", {"pos_margin": 0.0, "neg_margin": 1.0}, oracle_snr),
         ("snr_contrastive", {"pos_margin": 0.2, "neg_margin": 1.2}, oracle_snr)]


@pytest.mark.parametrize("name,hp,oracle", CASES,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(CASES)])
def test_matches_oracle_values_and_gradients(name, hp, oracle):
  e = batch(31, d=4, normalize=False)
  loss, aux, grad = run(name, e, LABELS, **hp)
  f = lambda x: oracle(x, LABELS, *hp.values())
  np.testing.assert_allclose(float(loss), f(e), rtol=1e-5, atol=1e-6)
  g = fd_grad(f, e)
  np.testing.assert_allclose(np.asarray(grad), g, rtol=1e-3,
                             atol=1e-5 * max(1.0, float(np.max(np.abs(g)))))
  assert 0.0 < float(aux["valid_fraction"]) <= 1.0


@pytest.mark.parametrize("name", ["fastap", "ranked_list", "histogram", "snr_contrastive",
                                  "smooth_ap", "pnp"])
def test_bf16_one_trace_and_finite_without_pairs(name):
  support.check_pair_bf16(name, rng=None)
  support.check_apply_traces_once_per_shape(name)
  for labels in (np.arange(12, dtype=np.int32), np.zeros(12, np.int32)):
    loss, _, grad = run(name, batch(14), labels)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))


def test_snr_contrastive_leaves_out_anchors_without_variance():
  # var(x_a) = 0 (a zero or constant embedding) has no SNR distance; such an anchor gave an
  # infinite loss and NaN gradients
  e = batch(31, d=4, normalize=False)
  e[3], e[7] = 0.0, 2.0
  loss, _, grad = run("snr_contrastive", e, LABELS, pos_margin=0.0, neg_margin=1.2)
  assert np.all(np.isfinite(np.asarray(grad)))
  keep = [a for a in range(len(LABELS)) if a not in (3, 7)]
  u = np.zeros((len(LABELS), 4))   # the zero row stays 0 (a reference at d = 1)
  u[keep + [7]] = _unit(e[keep + [7]])
  d = {(a, j): np.var(u[j] - u[a]) / np.var(u[a]) for a in keep
       for j in range(len(LABELS)) if j != a}
  pos = [max(v, 0) for (a, j), v in d.items() if LABELS[a] == LABELS[j]]
  neg = [max(1.2 - v, 0) for (a, j), v in d.items() if LABELS[a] != LABELS[j]]
  mean_nonzero = lambda v: np.mean([t for t in v if t > 0]) if any(t > 0 for t in v) else 0.0
  np.testing.assert_allclose(float(loss), mean_nonzero(pos) + mean_nonzero(neg), rtol=1e-5)


@pytest.mark.parametrize("flat", [(0.0, 0.0), (2.0, -0.5)])
def test_snr_contrastive_puts_a_reference_without_variance_exactly_at_distance_one(flat):
  # A zero or constant embedding is a reference at d = var(x_a - c) / var(x_a) = 1, exactly
  # the default neg_margin: its negative terms are 0 and not counted by the non-zero average
  # (PML). From the cosine form, d came out 1 -/+ 1e-7: terms of 1e-7 counted as non-zero
  # diluted the negatives' average.
  e = batch(5, d=8, normalize=False)
  e[2], e[9] = flat
  loss, _, grad = run("snr_contrastive", e, LABELS)
  assert np.all(np.isfinite(np.asarray(grad)))
  zero = (2, 9)
  keep = [a for a in range(len(LABELS)) if a not in zero]
  u = np.zeros(e.shape)
  u[keep] = _unit(e[keep])
  d = {(a, j): np.var(u[j] - u[a]) / np.var(u[a]) for a in keep
       for j in range(len(LABELS)) if j != a}
  pos = [max(v, 0) for (a, j), v in d.items() if LABELS[a] == LABELS[j]]
  neg = [max(1.0 - v, 0) * (j not in zero) for (a, j), v in d.items()
         if LABELS[a] != LABELS[j]]
  mean_nonzero = lambda v: np.mean([t for t in v if t > 0]) if any(t > 0 for t in v) else 0.0
  np.testing.assert_allclose(float(loss), mean_nonzero(pos) + mean_nonzero(neg), rtol=1e-5)


@pytest.mark.parametrize("num_bins", [10, 3])
def test_fastap_soft_histograms_equal_the_kernel_form(num_bins):
  """The two-kernel histograms and their custom VJP equal the triangular kernels over all
  ``L + 1`` bins and autodiff of them, at distances inside bins, at 0, at 4 and just above 4
  (a cosine rounded below -1)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from dml_jax.objectives import _ranking  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(num_bins)
  d2 = rng.uniform(0.0, 4.0, (6, 9)).astype(np.float32)
  d2[0, :3] = [0.0, 4.0, 4.0 + 2e-6]
  first, second = rng.random((6, 9)) < 0.4, rng.random((6, 9)) < 0.8
  gf, gs = (jnp.asarray(rng.standard_normal((6, num_bins + 1)), jnp.float32) for _ in range(2))
  centers = jnp.linspace(0.0, 4.0, num_bins + 1)

  def kernel_form(d):
    pulse = jax.nn.relu(1.0 - jnp.abs(d[..., None] - centers) / (4.0 / num_bins))
    return tuple(jnp.sum(jnp.where(m[..., None], pulse, 0.0), axis=1) for m in (first, second))

  def two_kernel(d):
    return _ranking.soft_histograms(d, jnp.asarray(first), jnp.asarray(second), num_bins)

  for a, b in zip(two_kernel(jnp.asarray(d2)), kernel_form(jnp.asarray(d2))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  weigh = lambda f: lambda d: sum(jnp.sum(g * h) for g, h in zip((gf, gs), f(d)))
  offset = np.asarray(d2, np.float64) % (4.0 / num_bins)
  kinks = np.isclose(offset, 0.0, atol=1e-7) | np.isclose(offset, 4.0 / num_bins, atol=1e-7)
  kinks[0, :2] = True   # d2 = 0 and 4: the kernel form's gradient there is a convention
  assert not kinks[0, 2]   # just above 4: compared
  np.testing.assert_allclose(np.where(kinks, 0.0, jax.grad(weigh(two_kernel))(jnp.asarray(d2))),
                             np.where(kinks, 0.0, jax.grad(weigh(kernel_form))(jnp.asarray(d2))),
                             rtol=1e-5, atol=1e-5)


def test_ranked_list_empty_reference_slots_change_nothing():
  """An empty cross-batch memory gives the loss and gradient without memory: the 1e-5 per
  reference in the normalisers counts only the references the anchor is compared with."""
  import jax  # pylint: disable=import-outside-toplevel
  from dml_jax import memory  # pylint: disable=import-outside-toplevel
  from dml_jax import objectives  # pylint: disable=import-outside-toplevel
  e, labels = batch(4, d=4, normalize=False), LABELS.astype(np.int32)
  obj = objectives.make("ranked_list")
  empty = memory.init(512, e.shape[1])
  plain = jax.jit(jax.value_and_grad(lambda x: obj.apply({}, x, labels)[0]))(e)
  with_memory = jax.jit(jax.value_and_grad(lambda x, m: obj.apply(
      {}, x, labels, references=memory.references(m, x, labels))[0]))(e, empty)
  np.testing.assert_allclose(float(with_memory[0]), float(plain[0]), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(with_memory[1]), np.asarray(plain[1]), rtol=1e-5,
                             atol=1e-7)


def test_ranked_list_large_temperatures_stay_finite():
  """T_n = T_p = 100 with a negative on top of its anchor (e^{T_n alpha} = e^120 overflows
  float32): the weights are shifted, loss and gradient equal the float64 oracle's."""
  e, labels = batch(6, d=4, normalize=False), LABELS.astype(np.int32)
  e[1] = e[0] + 1e-3 * e[1]               # a positive close to anchor 0 (the oracle's d > 0)
  e[np.flatnonzero(labels != labels[0])[0]] = e[0]     # a negative identical to anchor 0
  hp = {"margin": 0.4, "alpha": 1.2, "imbalance": 0.5, "tp": 100.0, "tn": 100.0}
  loss, _, grad = run("ranked_list", e, labels, **hp)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
  np.testing.assert_allclose(float(loss), oracle_ranked_list(e, labels, *hp.values()),
                             rtol=1e-4)


def test_smooth_ap_and_pnp_of_a_perfect_ranking():
  """Every positive of every anchor ahead of every negative by far more than T: Smooth-AP's AP
  is 1 and PNP counts no negative ahead (both losses 0 up to e^{-1/T})."""
  labels = np.repeat(np.arange(4), 3).astype(np.int32)
  e = np.eye(4, dtype=np.float32)[labels] + 0.01 * batch(3, d=4, normalize=False)
  for name in ("smooth_ap", "pnp"):
    for include_query in (True, False):
      loss = run(name, e, labels, include_query=include_query)[0]
      assert abs(float(loss)) < 1e-6, (name, include_query)


def test_smooth_ap_equals_the_per_class_block_computation_on_contiguous_equal_classes():
  """With classes of equal size in contiguous blocks (the batches PML's SmoothAPLoss takes), the
  masked form equals the per-class-block computation written out: the query is one of its own
  positives and in its own retrieval set, the ranks add one."""
  labels = np.repeat(np.arange(3), 4).astype(np.int32)
  e = batch(8, d=4, normalize=False)
  s, g, t = np_similarity(e), 4, 0.05
  ap = []
  for q in range(12):
    block = range((q // g) * g, (q // g + 1) * g)
    total = 0.0
    for p in block:
      all_rank = 1 + sum(_sigmoid((s[q, j] - s[q, p]) / t) for j in range(12) if j != p)
      pos_rank = 1 + sum(_sigmoid((s[q, j] - s[q, p]) / t) for j in block if j != p)
      total += pos_rank / all_rank
    ap.append(total / g)
  loss = run("smooth_ap", e, labels, temperature=t)[0]
  np.testing.assert_allclose(float(loss), np.mean(1 - np.asarray(ap)), rtol=1e-5)


@pytest.mark.parametrize("name,hp", [("smooth_ap", {"temperature": 0.1, "include_query": True}),
                                     ("pnp", {"variant": "Dq", "temperature": 0.05,
                                              "alpha": 2.0, "b": 3.0, "include_query": False})])
def test_smooth_ap_and_pnp_in_anchor_chunks_equal_the_oracle(monkeypatch, name, hp):
  """Chunks of 5 anchors over a batch of 12, each anchor's items compacted to P = 8 (a padded
  last chunk; the lax.map path that keeps large batches at O(B^2) memory): the oracle's loss
  and gradient."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from dml_jax import objectives  # pylint: disable=import-outside-toplevel
  from dml_jax.objectives import _ranking  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(_ranking, "RANK_CHUNK_ELEMENTS", 5 * 8 * len(LABELS))   # [5, 8, 12]
  obj = objectives.make(name, **hp)   # traced below, under the patched chunk size
  fn = jax.jit(jax.value_and_grad(lambda x: obj.apply({}, x, jnp.asarray(LABELS))[0]))
  assert "while" in fn.lower(jnp.zeros((len(LABELS), 4))).as_text()   # the chunked path
  e = batch(21, d=4, normalize=False)
  loss, grad = fn(jnp.asarray(e))
  oracle = {"smooth_ap": oracle_smooth_ap, "pnp": oracle_pnp}[name]
  f = lambda x: oracle(x, LABELS, *hp.values())
  np.testing.assert_allclose(float(loss), f(e), rtol=1e-5, atol=1e-6)
  g = fd_grad(f, e)
  np.testing.assert_allclose(np.asarray(grad), g, rtol=1e-3,
                             atol=1e-5 * max(1.0, float(np.max(np.abs(g)))))


@pytest.mark.parametrize("name,hp", [("smooth_ap", {"temperature": 0.05, "include_query": True}),
                                     ("pnp", {"variant": "Ds", "temperature": 0.05,
                                              "include_query": False})])
def test_smooth_ap_and_pnp_with_a_class_of_more_than_64_rank_every_item(name, hp):
  """A class of 70 (more ranked items per anchor than the largest compacted size, 64): the
  every-item path gives the dense [B, B, B] formula's loss and gradient."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from dml_jax import similarity as sim  # pylint: disable=import-outside-toplevel
  labels = np.concatenate([np.zeros(70), np.arange(1, 11) % 4 + 1]).astype(np.int32)
  e = batch(23, b=80, d=8, normalize=False)
  t, same = hp["temperature"], labels[:, None] == labels[None, :]
  eye = np.eye(80, dtype=bool)

  def dense(x):   # the formulas over every (anchor, item, item) triple
    s = sim.pairwise_similarity(x)
    ahead = jax.nn.sigmoid((s[:, None, :] - s[:, :, None]) / t) * ~eye[None]    # [a, p, j]
    ranked = same if hp["include_query"] else same & ~eye
    if name == "smooth_ap":
      cand = np.ones_like(eye) if hp["include_query"] else ~eye
      rank = lambda m: 1.0 + jnp.sum(jnp.where(m[:, None, :], ahead, 0.0), axis=2)
      per = jnp.sum(jnp.where(ranked, rank(ranked) / rank(cand), 0.0), axis=1)
      return jnp.mean(1.0 - per / ranked.sum(1))
    r = jnp.sum(jnp.where(~same[:, None, :], ahead, 0.0), axis=2)
    return jnp.mean(jnp.sum(jnp.where(ranked, jnp.log1p(r), 0.0), axis=1) / ranked.sum(1))

  loss, _, grad = run(name, e, labels, **hp)
  want, want_grad = jax.value_and_grad(dense)(jnp.asarray(e))
  np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-4,
                             atol=1e-6 * float(np.max(np.abs(want_grad))))


@pytest.mark.parametrize("name", ["smooth_ap", "pnp"])
def test_smooth_ap_and_pnp_under_vmap_checkpoint_and_disable_jit(name):
  """vmap over batches (whose largest class sizes pick different compacted sizes: the
  run-time switch batched), jax.checkpoint and disable_jit give the plain call; and the loss
  does not depend on the order of the batch."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from dml_jax import objectives  # pylint: disable=import-outside-toplevel
  support.check_vmap_over_a_leading_axis(name, rng=None)
  support.check_invariant_to_batch_permutation(name, rng=None)
  obj = objectives.make(name, temperature=0.1)
  sizes = [np.concatenate([np.zeros(70), np.arange(1, 11) % 4 + 1]).astype(np.int32),  # 70
           np.repeat(np.arange(10), 8).astype(np.int32)]                                # 8
  e = jnp.stack([jnp.asarray(batch(40 + t, b=80, d=8)) for t in range(2)])
  y = jnp.asarray(np.stack(sizes))
  loss = lambda x, l: obj.apply({}, x, l)[0]
  got = jax.jit(jax.vmap(jax.value_and_grad(loss)))(e, y)
  for t in range(2):
    want = jax.jit(jax.value_and_grad(loss))(e[t], y[t])
    np.testing.assert_allclose(got[0][t], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1][t], want[1], rtol=1e-4, atol=1e-7)
    ckpt = jax.jit(jax.value_and_grad(jax.checkpoint(loss)))(e[t], y[t])
    np.testing.assert_allclose(ckpt[1], want[1], rtol=1e-5, atol=1e-7)
    with jax.disable_jit():
      np.testing.assert_allclose(loss(e[t], y[t]), want[0], rtol=1e-5)
