"""Plain-numpy references for the objective, mining, loss and evaluation tests (float64, explicit
loops over pairs and triplets; no JAX): one copy of each, imported by every test that needs it
(conftest puts tests/ on sys.path)."""

import numpy as np

# Two classes of 3, two of 2 and two singletons (anchors 10 and 11 have no positive).
LABELS = np.array([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 5], np.int32)


def random_batch(seed=0, b=12, d=4, normalize=True):
  """float32 ``[b, d]`` Gaussian rows, L2-normalised unless ``normalize=False``."""
  x = np.random.default_rng(seed).normal(size=(b, d)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True) if normalize else x


def fd_grad(f, x, eps=1e-6):
  """Central finite differences of the scalar ``f`` at float64 ``x``."""
  x = np.array(x, np.float64)
  g = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    dx = np.zeros_like(x)
    dx[i] = eps
    g[i] = (f(x + dx) - f(x - dx)) / (2 * eps)
  return g


# ----------------------------------------------------------------------------- similarities


def np_similarity(e, kind="cosine"):
  """``[B, B]`` similarity of the rows of ``e``: cosine, dot or neg_sq_euclidean."""
  e = np.asarray(e, np.float64)
  if kind == "cosine":
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
  if kind == "neg_sq_euclidean":
    return -np.sum((e[:, None] - e[None]) ** 2, axis=-1)
  return e @ e.T


def np_sq_distance(s, kind="cosine"):
  """Squared distance from a similarity (``2 - 2 S`` for cosine, ``-S`` otherwise)."""
  return np.maximum(2 - 2 * s, 0.0) if kind == "cosine" else -s


def np_d2(e):
  """Squared distances of the L2-normalised rows of ``e``."""
  return np_sq_distance(np_similarity(e))


def np_triplet_distance(s, hp):
  """The distance the triplet hinge uses: d^2, or d for distance='euclidean'."""
  d2 = np_sq_distance(s, hp.get("similarity", "cosine"))
  return np.sqrt(np.maximum(d2, 1e-12)) if hp.get("distance") == "euclidean" else d2


# ----------------------------------------------------------------------------- label sets


def positives_of(labels, a):
  return [j for j in range(len(labels)) if j != a and labels[j] == labels[a]]


def negatives_of(labels, a):
  return [j for j in range(len(labels)) if labels[j] != labels[a]]


def pairs_of(labels):
  """[(i, j, is_positive)] over the ordered pairs i != j, by explicit loops."""
  return [(i, j, labels[i] == labels[j]) for i in range(len(labels))
          for j in range(len(labels)) if i != j]


# ----------------------------------------------------------------------------- triplet mining


def select_positives(score, labels, a, mode):
  """The positives of anchor ``a`` that ``mode`` keeps (easy: highest score, hard: lowest,
  otherwise all); ``[]`` without positive."""
  cand = positives_of(labels, a)
  if not cand or mode not in ("easy", "hard"):
    return cand
  pick = max if mode == "easy" else min
  return [pick(cand, key=lambda p: score[a, p])]


def oracle_positives(s, labels, mode):
  """{anchor: [selected positives]} from explicit loops; anchors without positives omitted."""
  return {a: select_positives(s, labels, a, mode) for a in range(len(labels))
          if positives_of(labels, a)}


def negative_candidates(score, labels, a, p, mode, margin=0.0):
  """The admissible negatives of term (a, p) (higher score = closer); a deterministic mode gives
  at most one. ``'semihard_random'``: positive triplet loss (label-noise paper eq. 28);
  ``'semihard_band'`` (Roth et al.'s miner, on scores ``-d``): the band, else every negative."""
  cand = negatives_of(labels, a)
  if mode == "hard":
    return [max(cand, key=lambda n: score[a, n])] if cand else []
  if mode == "easy":
    return [min(cand, key=lambda n: score[a, n])] if cand else []
  if mode == "semihard":
    below = [n for n in cand if score[a, n] <= score[a, p]]
    return [max(below, key=lambda n: score[a, n])] if below else []
  if mode == "semihard_random":
    return [n for n in cand if score[a, n] > score[a, p] - margin]
  if mode == "semihard_band":
    band = [n for n in cand if score[a, p] - margin < score[a, n] < score[a, p]]
    return band or cand
  return cand  # random, all


def np_keep_easiest(values, valid, keep_fraction):
  """The previous trimming implementation: stable argsort of all flat entries, ranks < k."""
  v = np.where(valid, values, np.inf).ravel()
  rank = np.empty(v.size, np.int64)
  rank[np.argsort(v, kind="stable")] = np.arange(v.size)
  k = np.ceil(np.float32(keep_fraction) * np.float32(valid.sum()) * np.float32(1 - 1e-6))
  return valid & (rank.reshape(values.shape) < k)


# ----------------------------------------------------------------------------- loss forms


def np_logsumexp(v):
  m = max(v)
  return m + np.log(sum(np.exp(u - m) for u in v))


def np_nca_all(s_ap, s_neg, mask, t, order):
  """Per-term loss, explicit loop: -log(e^{lp/T} / (e^{lp/T} + sum_n e^{ln/T}))."""
  out = np.zeros(s_ap.shape)
  for a in range(s_ap.shape[0]):
    for p in range(s_ap.shape[1]):
      lp = s_ap[a, p] if order == 1 else s_ap[a, p] - s_ap[a, p] ** 2 / 2
      negs = [s_neg[a, n] if order == 1 else s_neg[a, n] ** 2 / 2
              for n in range(s_neg.shape[1]) if mask[a, n]]
      out[a, p] = -lp / t + np_logsumexp([lp / t] + [ln / t for ln in negs]) if negs else 0.0
  return out


def np_triplet_all(d2_ap, d2_neg, mask, margin, reduction):
  out = np.zeros(d2_ap.shape)
  for a in range(d2_ap.shape[0]):
    for p in range(d2_ap.shape[1]):
      h = [max(d2_ap[a, p] - d2_neg[a, n] + margin, 0.0)
           for n in range(d2_neg.shape[1]) if mask[a, n]]
      out[a, p] = (sum(h) / max(len(h), 1)) if reduction == "mean" else sum(h)
  return out


def masked_total(x, valid):
  return float(np.sum(np.where(valid, x, 0.0)))


# ----------------------------------------------------------------------------- NCA / triplet


def oracle_terms(e, labels, name, hp, sel=None):
  """[(a, p, [negatives])] for NCA / triplet objective ``name``; ``sel`` (the library's draw,
  numpy) for random modes.

  Deterministic modes are selected here independently; for random modes the drawn positive /
  negative is checked to be admissible and then used.
  """
  kind = hp.get("similarity", "cosine")
  s = np_similarity(e, kind)
  d2 = np_triplet_distance(s, hp)
  score = -d2 if name == "triplet" else s
  positive, negative = hp["positive"], hp["negative"]
  if negative == "semihard_band":   # Roth et al.: the band is on plain distances
    score_n = -np.sqrt(np.maximum(np_sq_distance(s, kind), 1e-12))
  else:
    score_n = score
  terms = []
  for a in range(len(labels)):
    ps = positives_of(labels, a)
    if hp.get("skip_duplicate_positives"):
      ps = [p for p in ps if s[a, p] <= 0.9999]
    if not ps or not negatives_of(labels, a):
      if sel is not None:
        assert not sel.valid[a].any()
      continue
    if positive == "easy":
      ps = [max(ps, key=lambda p: score[a, p])]
    elif positive == "hard":
      ps = [min(ps, key=lambda p: score[a, p])]
    elif positive == "random":
      (p,) = np.flatnonzero(sel.pairs[a])
      assert p in ps
      ps = [p]
    for p in ps:
      cand = negative_candidates(score_n, labels, a, p, negative, hp.get("margin", 0.0))
      if sel is not None:
        assert bool(sel.valid[a, p]) == bool(cand), (a, p)
      if not cand:
        continue
      if negative in ("random", "semihard_random", "semihard_band"):
        n = int(sel.negative[a, p])
        assert n in cand, (a, p, n, cand)
        cand = [n]
      if hp.get("positive_similarity_only"):
        if s[a, p] <= 0:
          continue
        cand = [n for n in cand if s[a, n] > 0]
        if not cand:
          continue
      terms.append((a, p, cand))
  return terms


def oracle_term_losses(e, terms, name, hp):
  """Per-term losses of explicit triplets, float64."""
  kind = hp.get("similarity", "cosine")
  s = np_similarity(e, kind)
  out = []
  for a, p, negs in terms:
    if name in ("nca", "nca_2nd"):
      t = hp["temperature"]
      if name == "nca":
        lp, ln = s[a, p], [s[a, n] for n in negs]
      else:
        lp, ln = s[a, p] - s[a, p] ** 2 / 2, [s[a, n] ** 2 / 2 for n in negs]
      logits = np.array([lp] + ln) / t
      m = logits.max()
      out.append(-logits[0] + m + np.log(np.exp(logits - m).sum()))
    else:
      d2 = np_triplet_distance(s, hp)
      h = [max(d2[a, p] - d2[a, n] + hp["margin"], 0.0) for n in negs]
      out.append(sum(h) if hp["negative_reduction"] == "sum" else sum(h) / len(h))
  return np.array(out)


def oracle_loss(e, terms, name, hp):
  vals = oracle_term_losses(e, terms, name, hp)
  if name in ("nca", "nca_2nd") and hp["reduction"] == "sum":
    return float(vals.sum())
  return float(vals.mean()) if len(vals) else 0.0


def oracle_aux(e, labels, terms, name, hp):
  s = np_similarity(e, hp.get("similarity", "cosine"))
  vals = oracle_term_losses(e, terms, name, hp)
  active = vals > 0 if name == "triplet" else 1 - np.exp(-vals) > 1e-3
  n = max(len(terms), 1)
  return {
      "valid_fraction": len({a for a, _, _ in terms}) / len(labels),
      "active_fraction": active.sum() / n,
      "mean_s_ap": sum(s[a, p] for a, p, _ in terms) / n,
      "mean_s_an": sum(np.mean([s[a, k] for k in negs]) for a, _, negs in terms) / n,
  }


# ----------------------------------------------------------------------------- distance-weighted


def np_dw_probs(e, labels, *, cutoff=0.5, nonzero_loss_cutoff=1.4):
  """Pr(n | a) of distance-weighted sampling, by explicit loops (rows without weight: 0)."""
  dim = np.asarray(e).shape[1]
  dist = np.sqrt(np_d2(e))
  p = np.zeros((len(labels), len(labels)))
  for a in range(len(labels)):
    for n in range(len(labels)):
      if labels[n] != labels[a] and (dist[a, n] < nonzero_loss_cutoff
                                     or nonzero_loss_cutoff == 2.0):   # 2: no cut-off
        d = max(dist[a, n], cutoff)
        p[a, n] = d ** (2 - dim) * (1 - d * d / 4) ** (-(dim - 3) / 2)
    if p[a].sum() > 0:
      p[a] /= p[a].sum()
  return p


# ----------------------------------------------------------------------------- pair losses


def softplus(x):
  return np.logaddexp(0.0, x)


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def pair_loss_and_weight(hp, kind, s, is_pos):
  """One pair's loss and |dl/dS| (closed form), float64."""
  if kind in ("contrastive", "margin"):
    if kind == "contrastive":
      pm, nm = hp["pos_margin"], hp["neg_margin"]
    else:
      pm, nm = hp["base"] + hp["margin"], hp["base"] - hp["margin"]
    v = max(pm - s, 0.0) if is_pos else max(s - nm, 0.0)
    return v, float(v > 0)
  a, b, lam = hp["alpha"], hp["beta"], hp["base"]
  if is_pos:
    return 2 / b * softplus(-b * (s - lam)), 2 * sigmoid(-b * (s - lam))
  return 2 / a * softplus(a * (s - lam)), 2 * sigmoid(a * (s - lam))


def pair_kind(name, hp):
  if name in ("contrastive", "binomial"):
    return name
  return hp["pair_loss"]


def ms_sets(s, labels, i, hp):
  """Multi-similarity mining of anchor i, by explicit loops (released-code rules)."""
  ps = positives_of(labels, i)
  if hp["skip_duplicate_positives"]:
    ps = [j for j in ps if s[i, j] < 1 - 1e-5]
  ns = negatives_of(labels, i)
  eps = hp["epsilon"]
  cand = [max(ps, key=lambda j: s[i, j])] if hp["positive"] == "easy" and ps else ps
  if hp["positive"] == "ms":
    pk = [j for j in ps if ns and s[i, j] - eps < max(s[i, n] for n in ns)]
  else:
    pk = cand
  ref = cand if hp.get("negative_reference", "hardest") == "selected" else ps
  if hp["negative"] == "ms":
    nk = [j for j in ns if ref and s[i, j] + eps > min(s[i, p] for p in ref)]
  else:
    nk = ns
  return pk, nk


def ms_term(s, i, pk, nk, hp):
  a, b, lam = hp["alpha"], hp["beta"], hp["base"]
  pos = np.log1p(sum(np.exp(-a * (s[i, p] - lam)) for p in pk)) / a
  neg = np.log1p(sum(np.exp(b * (s[i, n] - lam)) for n in nk)) / b
  return pos + neg


def ms_weights(s, i, pk, nk, hp):
  """DRO paper eq. 27: |dL_i/dS_ij| of the MS loss."""
  a, b, lam = hp["alpha"], hp["beta"], hp["base"]
  w = {}
  for j in pk:
    w[j] = 1 / (np.exp(a * (s[i, j] - lam)) + sum(np.exp(a * (s[i, j] - s[i, k])) for k in pk))
  for j in nk:
    w[j] = 1 / (np.exp(b * (lam - s[i, j])) + sum(np.exp(b * (s[i, k] - s[i, j])) for k in nk))
  return w


def ls_bracket(s, i, ps, ns, hp):
  lam = hp["base"]
  return (np.log(sum(np.exp(lam - s[i, p]) for p in ps))
          + np.log(sum(np.exp(s[i, n] - lam) for n in ns)) + hp["margin"])


def anchor_sets(labels):
  """{anchor: (positives, negatives)} of the anchors that have both."""
  out = {}
  for i in range(len(labels)):
    ps, ns = positives_of(labels, i), negatives_of(labels, i)
    if ps and ns:
      out[i] = (ps, ns)
  return out


def plan(name, hp, e, labels, kl_counts=None):
  """The oracle of pair objective ``name`` at ``e``: ``(f, entering, active)``.

  ``f(e')`` is the loss at ``e'`` with every selection and weight frozen at ``e`` (they are
  under stop-gradient in the library), ``entering`` the pairs that enter the loss and
  ``active`` those whose own gradient weight exceeds 1e-3. ``kl_counts``: the library's
  ``[B, B]`` draw counts, for ``dro_kl`` with ``mode='sample'``.
  """
  s0 = np_similarity(e)
  n = len(labels)
  pairs = pairs_of(labels)
  kind = None if name in ("multi_similarity", "lifted_structure") else pair_kind(name, hp)
  pl = lambda s, i, j, p: pair_loss_and_weight(hp, kind, s[i, j], p)
  active_pair = lambda i, j, p: pl(s0, i, j, p)[1] > 1e-3

  if name in ("contrastive", "binomial"):
    def f(e1):
      s = np_similarity(e1)
      vals = [(pl(s, i, j, p)[0], p) for i, j, p in pairs]
      if hp["reduction"] == "mean":
        return np.mean([v for v, _ in vals]) if vals else 0.0
      pos = [v for v, p in vals if p]
      neg = [v for v, p in vals if not p]
      return (np.mean(pos) if pos else 0.0) + (np.mean(neg) if neg else 0.0)
    entering = [(i, j) for i, j, _ in pairs]
    active = {(i, j) for i, j, p in pairs if active_pair(i, j, p)}
    return f, entering, active

  if name == "multi_similarity":
    sets = {}
    for i in range(n):
      pk, nk = ms_sets(s0, labels, i, hp)
      if pk and nk:
        sets[i] = (pk, nk)
    f = lambda e1: sum(ms_term(np_similarity(e1), i, pk, nk, hp)
                       for i, (pk, nk) in sets.items()) / n
    entering = [(i, j) for i, (pk, nk) in sets.items() for j in pk + nk]
    active = {(i, j) for i, (pk, nk) in sets.items()
              for j, w in ms_weights(s0, i, pk, nk, hp).items() if w > 1e-3}
    return f, entering, active

  if name == "lifted_structure":
    sets = anchor_sets(labels)
    f = lambda e1: sum(max(ls_bracket(np_similarity(e1), i, ps, ns, hp), 0.0)
                       for i, (ps, ns) in sets.items()) / n
    entering = [(i, j) for i, (ps, ns) in sets.items() for j in ps + ns]
    active = set()
    for i, (ps, ns) in sets.items():
      if ls_bracket(s0, i, ps, ns, hp) > 0:      # eq. 6 weights while the hinge is open
        zp = sum(np.exp(-s0[i, k]) for k in ps)
        zn = sum(np.exp(s0[i, k]) for k in ns)
        active |= {(i, j) for j in ps if np.exp(-s0[i, j]) / zp > 1e-3}
        active |= {(i, j) for j in ns if np.exp(s0[i, j]) / zn > 1e-3}
    return f, entering, active

  loss0 = {(i, j): pl(s0, i, j, p)[0] for i, j, p in pairs}
  is_pos = {(i, j): p for i, j, p in pairs}

  def weighted(weights, norm):
    def f(e1):
      s = np_similarity(e1)
      return sum(w * pl(s, i, j, is_pos[i, j])[0] for (i, j), w in weights.items()) / norm
    entering = [ij for ij, w in weights.items() if w > 0]
    return f, entering, {ij for ij in entering if active_pair(*ij, is_pos[ij])}

  def top(cands, k):   # largest loss first, ties by the lower flat index (lax.top_k)
    return sorted(cands, key=lambda ij: (-loss0[ij], ij[0] * n + ij[1]))[:k]

  # The DRO paper's K counts distinct pairs: the released code takes 2K ordered pairs.
  if name == "dro_topk":
    k = min(2 * hp["k"], len(pairs))
    return weighted({ij: 1.0 for ij in top(list(loss0), k)}, k)
  if name == "dro_topk_pn":
    kp, kn = 2 * (hp["k"] // 2), 2 * (hp["k"] - hp["k"] // 2)
    sel_pos = top([ij for ij in loss0 if is_pos[ij]], kp)
    if hp["balanced"] and len(sel_pos) < kp:   # short of positives: as many negatives
      kn = len(sel_pos)
    sel = sel_pos + top([ij for ij in loss0 if not is_pos[ij]], kn)
    return weighted({ij: 1.0 for ij in sel}, max(len(sel), 1))
  if name == "dro_kl":
    cand = [ij for ij in loss0 if loss0[ij] > 0 or not hp["remove_zero_loss"]]
    if hp["mode"] == "weight":
      z = np.array([loss0[ij] / hp["gamma"] for ij in cand])
      p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
      return weighted(dict(zip(cand, p)), 1.0)
    counts = kl_counts
    assert counts.sum() == 2 * hp["k"]
    assert all(counts[ij] == 0 for ij in np.ndindex(counts.shape) if ij not in cand)
    return weighted({ij: float(counts[ij]) for ij in cand}, 2 * hp["k"])
  if name == "dro_kl_grouped":
    weights = {}
    for i, (ps, ns) in anchor_sets(labels).items():
      for group, gamma, c, positive in ((ps, hp["gamma_pos"], hp["c_pos"], True),
                                        (ns, hp["gamma_neg"], hp["c_neg"], False)):
        group = [j for j in group if loss0[i, j] > 0 or not hp["remove_zero_loss"]]
        z = [loss0[i, j] / gamma for j in group]
        if hp["pseudo_pairs"]:
          z0 = 0.0 if c is None else pair_loss_and_weight(hp, kind, c, positive)[0] / gamma
          z.append(z0)
        if not group:
          continue
        z = np.array(z)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        weights.update({(i, j): p[t] for t, j in enumerate(group)})
    return weighted(weights, n)
  raise AssertionError(name)


def pair_aux(e, labels, entering, active):
  """The aux diagnostics of a pair objective from its oracle plan."""
  s = np_similarity(e)
  return {
      "valid_fraction": len({i for i, _ in entering}) / len(labels),
      "active_fraction": len(active) / len(entering),
      "mean_s_ap": np.mean([s[ij] for ij in entering if labels[ij[0]] == labels[ij[1]]] or [0]),
      "mean_s_an": np.mean([s[ij] for ij in entering if labels[ij[0]] != labels[ij[1]]] or [0]),
  }


# ----------------------------------------------------------------------------- retrieval


def ranked_gallery(query, gallery, kind):
  """Brute-force oracle in float64: for every query, ``[(similarity, gallery index), ...]``
  over explicit pairs, sorted by (-similarity, index); self excluded when ``gallery`` is None."""
  exclude_self = gallery is None
  q = np.asarray(query, np.float64)
  g = q if exclude_self else np.asarray(gallery, np.float64)
  ranked = []
  for i in range(q.shape[0]):
    scored = []
    for j in range(g.shape[0]):
      if exclude_self and i == j:
        continue
      if kind == "cosine":
        s = q[i] @ g[j] / (np.linalg.norm(q[i]) * np.linalg.norm(g[j]))
      elif kind == "dot":
        s = q[i] @ g[j]
      else:
        s = -np.sum((q[i] - g[j]) ** 2)
      scored.append((-s, j))
    scored.sort()
    ranked.append([(-s, j) for s, j in scored])
  return ranked


def best_relevant_oracle(s, q_codes, g_codes, exclude_self):
  """The best same-class item of every row of ``s [Nq, Ng]`` (lowest index on ties):
  ``(value, index)``, ``(+inf, -1)`` where none."""
  value = np.full(s.shape[0], np.inf, np.float32)
  index = np.full(s.shape[0], -1, np.int32)
  for i in range(s.shape[0]):
    same = [j for j in range(s.shape[1])
            if g_codes[j] == q_codes[i] and not (exclude_self and i == j)]
    if same:
      j = max(same, key=lambda j: (s[i, j], -j))
      value[i], index[i] = s[i, j], j
  return value, index
