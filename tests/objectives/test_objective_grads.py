"""``jax.test_util.check_grads`` (reverse mode, order 1) of one objective per family, w.r.t. the
embeddings and the objective's parameters: autodiff against finite differences of ``apply``.

Each case is chosen so that finite differences see the same loss as autodiff: selections are
discrete (a small step does not change them) and no weight computed under stop-gradient varies
continuously with the embeddings (which would make the numerical derivative differ by design,
e.g. DRO-KL weights).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from oracles import random_batch
from dml_jax import objectives

LABELS = np.array([0, 0, 0, 1, 1, 2, 2, 3], np.int32)   # anchor 7 has no positive
B, D = len(LABELS), 4

FAMILIES = [
    ("nca", dict(positive="easy", negative="hard")),                 # _nca.py
    ("triplet", dict(positive="all", negative="all", margin=4.0)),   # _triplet.py: hinges open
    ("proxy_nca", {}),                                               # _proxy.py (d proxies too)
    ("binomial", {}),                                                # _pairs.py
    ("dro_topk", dict(k=20, pair_loss="binomial")),                  # _dro.py
]


@pytest.mark.parametrize("name,kw", FAMILIES, ids=[n for n, _ in FAMILIES])
def test_check_grads(name, kw):
  obj = objectives.make(name, **kw)
  params = obj.init(jax.random.key(0), num_classes=4, dim=D)
  labels = jnp.asarray(LABELS)
  jitted = jax.jit(lambda p, e, y: obj.apply(p, e, y, rng=jax.random.key(1))[0])
  loss = lambda p, e: jitted(p, e, labels)   # labels traced: no eager label-range check
  e = jnp.asarray(random_batch(3, B, D))
  assert float(loss(params, e)) > 0
  check_grads(loss, (params, e), order=1, modes=("rev",), eps=1e-3, atol=1e-2, rtol=1e-2)
