"""The small CNN of the EPS paper's MNIST even/odd experiment (appendix "MNIST architecture
details").

``x [B, H, W, C]`` -> conv 3x3, 32 (SAME) -> ReLU -> BatchNorm -> conv 3x3, 64 (SAME) -> ReLU
-> BatchNorm -> 2x2 max-pool (stride 2) -> flatten ``[B, (H//2)(W//2) 64]`` -> dense 128 ->
ReLU -> dense ``D`` -> optional L2 normalisation -> ``[B, D]`` float32.

BatchNorm uses the batch statistics and updates its running averages in train mode
(``model.train()``, the state after construction) and uses the running averages in eval mode
(``model.eval()``), where every example's embedding is independent of the rest of the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dml_jax.models import conv, heads, pooling


class SmallCNN(nnx.Module):
  """Two conv + BatchNorm blocks, max-pool and two dense layers.

  Args:
    embedding_dim: ``D`` (2 in the paper's experiment).
    normalize: L2-normalise the embedding (``False`` for the raw 2-D embedding).
    image_size: ``(H, W)`` (or one int for square images) of the inputs; fixes the size of
      the first dense layer. 8 for the scikit-learn digits, 28 for MNIST.
    in_channels: ``C`` of the inputs.
    conv_features: filters of the two convolutions.
    hidden: width of the first dense layer.
    momentum: BatchNorm running-average momentum: ``m <- momentum m + (1 - momentum) batch``.
    epsilon: BatchNorm variance epsilon.
    conv_impl: how the convolutions and the max-pool are computed (same parameters, same
      results to float32 rounding): ``'auto'`` (default: im2col matmuls where lowered for the
      CPU, XLA's convolution elsewhere; max-pooling by shifted slices), ``'lax'`` (XLA's
      convolution and ``reduce_window``), ``'matmul'`` or ``'lax_aligned'`` (XLA's
      convolution, the input channels zero-padded to 8); see ``conv`` and ``pooling``.
    rngs: ``nnx.Rngs`` for the initialisation.
  """

  def __init__(self, *, embedding_dim: int, normalize: bool = True,
               image_size: int | tuple[int, int] = 8, in_channels: int = 1,
               conv_features: tuple[int, int] = (32, 64), hidden: int = 128,
               momentum: float = 0.9, epsilon: float = 1e-5, conv_impl: str = "auto",
               rngs: nnx.Rngs):
    if isinstance(image_size, int):
      image_size = (image_size, image_size)
    image_size = tuple(int(s) for s in image_size)
    if len(image_size) != 2 or min(image_size) < 2:
      raise ValueError(f"image_size={image_size} must be (H, W) with H, W >= 2 (2x2 pooling).")
    if embedding_dim < 1:
      raise ValueError(f"embedding_dim={embedding_dim} must be >= 1.")
    if not 0.0 <= momentum < 1.0:
      raise ValueError(f"momentum={momentum} must be in [0, 1).")
    if len(conv_features) != 2:
      raise ValueError(f"conv_features={conv_features} must list two filter counts.")
    conv_fn = conv.conv_function(conv_impl)
    f1, f2 = conv_features
    self.image_size = image_size
    self.in_channels = in_channels
    self.normalize = normalize
    self.conv_impl = conv_impl
    self.conv1 = nnx.Conv(in_channels, f1, kernel_size=(3, 3), padding="SAME",
                          conv_general_dilated=conv_fn, rngs=rngs)
    self.bn1 = nnx.BatchNorm(f1, momentum=momentum, epsilon=epsilon, rngs=rngs)
    self.conv2 = nnx.Conv(f1, f2, kernel_size=(3, 3), padding="SAME",
                          conv_general_dilated=conv_fn, rngs=rngs)
    self.bn2 = nnx.BatchNorm(f2, momentum=momentum, epsilon=epsilon, rngs=rngs)
    flat = (image_size[0] // 2) * (image_size[1] // 2) * f2
    self.dense1 = nnx.Linear(flat, hidden, rngs=rngs)
    self.dense2 = nnx.Linear(hidden, embedding_dim, rngs=rngs)

  def features(self, x: jax.Array) -> jax.Array:
    """The conv trunk: ``[B, H, W, C] -> [B, (H//2) (W//2) f2]`` (after pooling, flattened)."""
    expected = (*self.image_size, self.in_channels)
    if x.ndim != 4 or tuple(x.shape[1:]) != expected:
      raise ValueError(f"SmallCNN expects images [B, {expected[0]}, {expected[1]}, "
                       f"{expected[2]}], got shape {x.shape}.")
    x = x.astype(jnp.float32)
    x = self.bn1(nnx.relu(self.conv1(x)))
    x = self.bn2(nnx.relu(self.conv2(x)))
    x = pooling.max_pool(x, (2, 2), (2, 2), "VALID", impl=self.conv_impl)
    return x.reshape(x.shape[0], -1)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Embeds images: float ``[B, H, W, C]`` -> float32 ``[B, D]`` (unit rows if normalize)."""
    h = nnx.relu(self.dense1(self.features(x)))
    return heads.finalize_embedding(self.dense2(h), normalize=self.normalize)
