// Direct VALID convolutions in NHWC for the CPU (dml_jax.models.conv, conv_impl
// 'auto' on the CPU), as two XLA FFI handlers: the forward convolution (also the input
// gradient, as the convolution of the padded output gradient with the flipped, transposed
// kernel) and the kernel gradient. No patch matrix is formed: the taps are read from the
// input in place by register-blocked AVX2 + FMA micro-kernels.
//
//   forward:  y[n, h, w, o]     = sum_{i, j, c} x[n, s h + i, s' w + j, c] k[i, j, c, o]
//   kernel gradient: dk[i, j, c, o] = sum_{n, h, w} x[n, s h + i, s' w + j, c] dy[n, h, w, o]
//
// x [N, H, W, C] (already padded by the caller), k [KH, KW, C, O], strides (s, s'), y and dy
// [N, (H - KH) / s + 1, (W - KW) / s' + 1, O], all float32, O a multiple of 8. Register tiles
// of 6 output pixels x 16 outputs (forward) or 6 channels x 16 outputs (kernel gradient);
// the work is split on XLA's intra-op threads: the forward pass by (pixel range, output
// block), the kernel gradient by (tap, output block) when x and dy fit the cache, else by
// pixel ranges, each summed into a buffer of its own and added at the end; with C and O of
// 256 and more (the caller's choice, attribute "pack"), the kernel gradient's operands are
// packed into contiguous panels first and the threads split the channels
// (PackedKernelGrad). Sums run in
// another order than XLA's convolution: equal to float32 rounding. "vectorized" = 0 runs the
// scalar form (CPUs without AVX2 + FMA; tests).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common.h"

namespace ffi = xla::ffi;
using dml_jax::ParallelFor;
using dml_jax::UseAvx2;

namespace {

constexpr int64_t kPixelsPerTask = 192;        // output pixels per task of the forward pass
constexpr int64_t kGradPixelsPerBlock = 128;   // output pixels summed per register tile of dk
constexpr int64_t kMaxPartialBytes = 64 << 20;
constexpr int64_t kMinPixelsPerPart = 512;
constexpr int64_t kSplitOutputsBelowBytes = 4 << 20;   // x + dy
constexpr int64_t kGradBlockPixels = 256;   // pixels per packed block of x
constexpr int64_t kGradTileRows = 6;        // channels per register tile of the packed form

struct Geometry {
  int64_t n, h, w, c;      // input (padded)
  int64_t kh, kw, o;       // kernel
  int64_t ho, wo;          // output
  int64_t sh, sw;          // strides
};

// ---- scalar forms ----

void ForwardPixelsScalar(const float* x, const float* k, float* y, const Geometry& g,
                         int64_t q0, int64_t q1) {
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t w = q % g.wo, nh = q / g.wo, n = nh / g.ho, h = nh % g.ho;
    float* out = y + q * g.o;
    std::memset(out, 0, sizeof(float) * g.o);
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const float* xin = x + ((n * g.h + h * g.sh + i) * g.w + w * g.sw + j) * g.c;
        const float* kk = k + (i * g.kw + j) * g.c * g.o;
        for (int64_t c = 0; c < g.c; ++c) {
          for (int64_t o = 0; o < g.o; ++o) out[o] += xin[c] * kk[c * g.o + o];
        }
      }
    }
  }
}

// offsets[q]: where output pixel q's tap (0, 0) starts in x (q = (n Ho + h) Wo + w).
std::vector<int64_t> PixelOffsets(const Geometry& g) {
  std::vector<int64_t> offsets(static_cast<size_t>(g.n * g.ho * g.wo));
  int64_t q = 0;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t h = 0; h < g.ho; ++h)
      for (int64_t w = 0; w < g.wo; ++w) {
        offsets[q++] = ((n * g.h + h * g.sh) * g.w + w * g.sw) * g.c;
      }
  return offsets;
}

void KernelGradPixelsScalar(const float* x, const int64_t* offsets, const float* dy, float* dk,
                            const Geometry& g, int64_t q0, int64_t q1) {
  for (int64_t q = q0; q < q1; ++q) {
    const float* d = dy + q * g.o;
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const float* xin = x + offsets[q] + (i * g.w + j) * g.c;
        float* kk = dk + (i * g.kw + j) * g.c * g.o;
        for (int64_t c = 0; c < g.c; ++c) {
          for (int64_t o = 0; o < g.o; ++o) kk[c * g.o + o] += xin[c] * d[o];
        }
      }
    }
  }
}

// ---- AVX2 + FMA forms ----

#ifdef DML_JAX_X86
// M consecutive output pixels q0 .. q0 + M (q = (n Ho + h) Wo + w: a tile may span rows and
// images) x the 8 NV output channels from o0, all taps: y = sum x k. `panel` is the kernel's
// columns o0 .. o0 + 8 NV packed contiguously, [KH KW C, 8 NV].
template <int M, int NV>
__attribute__((target("avx2,fma"))) inline void ForwardTile(const float* x,
                                                            const int64_t* offsets,
                                                            const float* panel, float* y,
                                                            const Geometry& g, int64_t q0,
                                                            int64_t o0) {
  const float* base[M];   // input pixel of tap (0, 0) for each output pixel
  DML_JAX_UNROLL for (int p = 0; p < M; ++p) base[p] = x + offsets[q0 + p];
  __m256 acc[M][NV];
  DML_JAX_UNROLL for (int p = 0; p < M; ++p)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) acc[p][v] = _mm256_setzero_ps();
  const float* kk = panel;
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t offset = (i * g.w + j) * g.c;
      for (int64_t c = 0; c < g.c; ++c, kk += 8 * NV) {
        __m256 b[NV];
        DML_JAX_UNROLL for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(kk + 8 * v);
        DML_JAX_UNROLL for (int p = 0; p < M; ++p) {
          const __m256 a = _mm256_broadcast_ss(base[p] + offset + c);
          DML_JAX_UNROLL for (int v = 0; v < NV; ++v) {
            acc[p][v] = _mm256_fmadd_ps(a, b[v], acc[p][v]);
          }
        }
      }
    }
  }
  DML_JAX_UNROLL for (int p = 0; p < M; ++p)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v)
      _mm256_storeu_ps(y + (q0 + p) * g.o + o0 + 8 * v, acc[p][v]);
}

template <int NV>
__attribute__((target("avx2,fma"))) void ForwardPixelsBlock(const float* x,
                                                            const int64_t* offsets,
                                                            const float* panel, float* y,
                                                            const Geometry& g, int64_t q0,
                                                            int64_t q1, int64_t o0) {
  constexpr int kM = NV == 2 ? 6 : 12;   // 12 accumulators either way
  int64_t q = q0;
  for (; q + kM <= q1; q += kM) ForwardTile<kM, NV>(x, offsets, panel, y, g, q, o0);
  dml_jax::WithTailSize(q1 - q, [&](auto m) {  // the last pixels, fewer than kM
    ForwardTile<decltype(m)::value, NV>(x, offsets, panel, y, g, q, o0);
  });
}

// Output pixels [q0, q1) x the output block starting at o0 (16 wide, or the last 8), from the
// packed kernel (panels of KH KW C x 16, the last one x 8).
__attribute__((target("avx2,fma"))) void ForwardUnitAvx2(const float* x,
                                                         const int64_t* offsets,
                                                         const float* packed, float* y,
                                                         const Geometry& g, int64_t q0,
                                                         int64_t q1, int64_t o0) {
  const float* panel = packed + g.kh * g.kw * g.c * o0;
  if (o0 + 16 <= g.o) {
    ForwardPixelsBlock<2>(x, offsets, panel, y, g, q0, q1, o0);
  } else {
    ForwardPixelsBlock<1>(x, offsets, panel, y, g, q0, q1, o0);
  }
}

// dk[tap (i, j), c0 .. c0 + M, o0 .. o0 + 8 NV] += sum over the output pixels [q0, q1).
template <int M, int NV>
__attribute__((target("avx2,fma"))) inline void KernelGradTile(const float* x,
                                                               const int64_t* offsets,
                                                               const float* dy, float* dk,
                                                               const Geometry& g, int64_t q0,
                                                               int64_t q1, int64_t i,
                                                               int64_t j, int64_t c0,
                                                               int64_t o0) {
  float* kk = dk + ((i * g.kw + j) * g.c + c0) * g.o + o0;
  const float* xt = x + (i * g.w + j) * g.c + c0;
  __m256 acc[M][NV];
  DML_JAX_UNROLL for (int r = 0; r < M; ++r)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_loadu_ps(kk + r * g.o + 8 * v);
  for (int64_t q = q0; q < q1; ++q) {
    const float* xin = xt + offsets[q];
    __m256 b[NV];
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(dy + q * g.o + o0 + 8 * v);
    DML_JAX_UNROLL for (int r = 0; r < M; ++r) {
      const __m256 a = _mm256_broadcast_ss(xin + r);
      DML_JAX_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  DML_JAX_UNROLL for (int r = 0; r < M; ++r)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) _mm256_storeu_ps(kk + r * g.o + 8 * v, acc[r][v]);
}

// One tap (i, j) and the outputs o0 .. o0 + 8 NV, every channel, pixels [q0, q1): into dk.
template <int NV>
__attribute__((target("avx2,fma"))) void KernelGradTap(const float* x, const int64_t* offsets,
                                                       const float* dy, float* dk,
                                                       const Geometry& g, int64_t q0,
                                                       int64_t q1, int64_t i, int64_t j,
                                                       int64_t o0) {
  constexpr int kM = NV == 2 ? 6 : 12;   // 12 accumulators either way
  int64_t c0 = 0;
  for (; c0 + kM <= g.c; c0 += kM) {
    KernelGradTile<kM, NV>(x, offsets, dy, dk, g, q0, q1, i, j, c0, o0);
  }
  dml_jax::WithTailSize(g.c - c0, [&](auto m) {  // the last channels, fewer than kM
    KernelGradTile<decltype(m)::value, NV>(x, offsets, dy, dk, g, q0, q1, i, j, c0, o0);
  });
}

// Tap (i, j) and the output block starting at o0 (16 wide, or the last 8), pixels [q0, q1),
// in blocks of kGradPixelsPerBlock pixels (the register tile's span).
__attribute__((target("avx2,fma"))) void KernelGradUnitAvx2(const float* x,
                                                            const int64_t* offsets,
                                                            const float* dy, float* dk,
                                                            const Geometry& g, int64_t q0,
                                                            int64_t q1, int64_t i, int64_t j,
                                                            int64_t o0) {
  for (int64_t b0 = q0; b0 < q1; b0 += kGradPixelsPerBlock) {
    const int64_t b1 = std::min(q1, b0 + kGradPixelsPerBlock);
    if (o0 + 16 <= g.o) {
      KernelGradTap<2>(x, offsets, dy, dk, g, b0, b1, i, j, o0);
    } else {
      KernelGradTap<1>(x, offsets, dy, dk, g, b0, b1, i, j, o0);
    }
  }
}

// With many channels and outputs (models/conv.py's PACK_MIN_CHANNELS), the rows of x and dy
// that a tile reads lie C or O floats apart and fall into a few cache sets. There the
// operands are first copied into panels that a tile reads contiguously: all of dy as [O / 16][pixels][16] (the last 8
// wide when O % 16 == 8), and per block of kGradBlockPixels pixels and tap, x's channels as
// [tiles of 6][pixels][6] (the last tile zero-filled). The copies cost O(pixels (KH KW C +
// O)), the sums O(pixels KH KW C O).

// dy's output block o0 (16 wide, or the last 8) for every pixel into panels + o0 pixels.
void PackOutputGradBlock(const float* dy, const Geometry& g, int64_t pixels, int64_t o0,
                         float* panels) {
  const int64_t width = std::min<int64_t>(16, g.o - o0);
  float* panel = panels + o0 * pixels;
  for (int64_t q = 0; q < pixels; ++q) {
    std::memcpy(panel + q * width, dy + q * g.o + o0, sizeof(float) * width);
  }
}

// The channels [c0, c1) that tap `offset` reads for the pixels [b0, b0 + len): channel
// c0 + 6 t + r of pixel b0 + p at panels[(t len + p) 6 + r], zeros past c1.
void PackInputBlock(const float* x, const int64_t* offsets, int64_t offset, int64_t b0,
                    int64_t len, int64_t c0, int64_t c1, float* panels) {
  const int64_t tiles = (c1 - c0 + kGradTileRows - 1) / kGradTileRows;
  for (int64_t p = 0; p < len; ++p) {
    const float* row = x + offsets[b0 + p] + offset + c0;
    for (int64_t t = 0; t < tiles; ++t) {
      float* out = panels + (t * len + p) * kGradTileRows;
      const int64_t m = std::min<int64_t>(kGradTileRows, c1 - c0 - t * kGradTileRows);
      for (int64_t r = 0; r < m; ++r) out[r] = row[t * kGradTileRows + r];
      for (int64_t r = m; r < kGradTileRows; ++r) out[r] = 0.0f;
    }
  }
}

// dk's M rows (from `dk`, row stride ldk) x 8 NV columns += the sum over len pixels of the
// input panel `a` ([len][6], its first M rows) times the output-gradient panel `b`
// ([len][8 NV]).
template <int M, int NV>
__attribute__((target("avx2,fma"))) inline void PackedGradTile(const float* a, const float* b,
                                                               int64_t len, float* dk,
                                                               int64_t ldk) {
  __m256 acc[M][NV];
  DML_JAX_UNROLL for (int r = 0; r < M; ++r)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_loadu_ps(dk + r * ldk + 8 * v);
  for (int64_t p = 0; p < len; ++p, a += kGradTileRows, b += 8 * NV) {
    __m256 bv[NV];
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(b + 8 * v);
    DML_JAX_UNROLL for (int r = 0; r < M; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r);
      DML_JAX_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  DML_JAX_UNROLL for (int r = 0; r < M; ++r)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) _mm256_storeu_ps(dk + r * ldk + 8 * v, acc[r][v]);
}

// One tap's dk rows [c0, c1) (`dk` at row c0) += the block [b0, b0 + len): input panels `a`
// (PackInputBlock's), output-gradient panels `dyp` (all pixels). The output panel (16 KB)
// stays in the L1 cache while the block's input panels stream past it.
__attribute__((target("avx2,fma"))) void PackedGradBlock(const float* a, const float* dyp,
                                                         const Geometry& g, int64_t pixels,
                                                         int64_t b0, int64_t len, int64_t c0,
                                                         int64_t c1, float* dk) {
  const int64_t tiles = (c1 - c0 + kGradTileRows - 1) / kGradTileRows;
  for (int64_t o0 = 0; o0 < g.o; o0 += 16) {
    const bool wide = o0 + 16 <= g.o;
    const float* b = dyp + o0 * pixels + b0 * (wide ? 16 : 8);
    for (int64_t t = 0; t < tiles; ++t) {
      const float* at = a + t * len * kGradTileRows;
      float* out = dk + t * kGradTileRows * g.o + o0;
      const int64_t m = std::min<int64_t>(kGradTileRows, c1 - c0 - t * kGradTileRows);
      if (wide && m == kGradTileRows) {
        PackedGradTile<kGradTileRows, 2>(at, b, len, out, g.o);
      } else if (wide) {
        dml_jax::WithTailSize(m, [&](auto rows) {
          PackedGradTile<decltype(rows)::value, 2>(at, b, len, out, g.o);
        });
      } else {
        dml_jax::WithTailSize(m, [&](auto rows) {
          PackedGradTile<decltype(rows)::value, 1>(at, b, len, out, g.o);
        });
      }
    }
  }
}

// dk's rows [c0, c1) of every tap (`dk` the whole [KH, KW, C, O]) = the sum over all
// pixels, from the packed dy `dyp`.
__attribute__((target("avx2,fma"))) void PackedGradRange(const float* x, const int64_t* offsets,
                                                         const float* dyp, float* dk,
                                                         const Geometry& g, int64_t pixels,
                                                         int64_t c0, int64_t c1) {
  const int64_t rows = (c1 - c0 + kGradTileRows - 1) / kGradTileRows * kGradTileRows;
  std::vector<float> a(static_cast<size_t>(kGradBlockPixels * rows));
  for (int64_t b0 = 0; b0 < pixels; b0 += kGradBlockPixels) {
    const int64_t len = std::min(pixels - b0, kGradBlockPixels);
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        PackInputBlock(x, offsets, (i * g.w + j) * g.c, b0, len, c0, c1, a.data());
        PackedGradBlock(a.data(), dyp, g, pixels, b0, len, c0, c1,
                        dk + ((i * g.kw + j) * g.c + c0) * g.o);
      }
    }
  }
}
#endif


ffi::Error MakeGeometry(const ffi::Buffer<ffi::F32>& x, int64_t kh, int64_t kw, int64_t o,
                        int64_t sh, int64_t sw, Geometry* g) {
  auto d = x.dimensions();
  if (d.size() != 4) return ffi::Error::InvalidArgument("conv: x must be [N, H, W, C]");
  if (sh < 1 || sw < 1 || d[1] < kh || d[2] < kw || o % 8 != 0) {
    return ffi::Error::InvalidArgument("conv: the kernel must fit the input, strides >= 1, "
                                       "O % 8 == 0");
  }
  *g = Geometry{d[0], d[1], d[2], d[3], kh, kw, o, (d[1] - kh) / sh + 1, (d[2] - kw) / sw + 1,
                sh, sw};
  return ffi::Error::Success();
}


ffi::Error ForwardImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> k,
                       int32_t stride_h, int32_t stride_w, int32_t vectorized,
                       ffi::ResultBuffer<ffi::F32> y) {
  auto kd = k.dimensions();
  if (kd.size() != 4 || kd[2] != x.dimensions()[3]) {
    return ffi::Error::InvalidArgument("conv: k must be [KH, KW, C, O], C as x's");
  }
  Geometry g;
  if (auto e = MakeGeometry(x, kd[0], kd[1], kd[3], stride_h, stride_w, &g); e.failure()) {
    return e;
  }
  const bool avx2 = UseAvx2(vectorized);
  const float *xs = x.typed_data(), *ks = k.typed_data();
  float* ys = y->typed_data();
  const int64_t pixels = g.n * g.ho * g.wo;
#ifdef DML_JAX_X86
  if (avx2) {
    // The kernel packed by output blocks, [O / 16][KH KW C][16] (the last block 8 wide when
    // O % 16 == 8), so that a tile streams its columns contiguously; the work split into
    // (pixel range, output block) units.
    const int64_t taps = g.kh * g.kw * g.c;
    std::vector<float> packed(static_cast<size_t>(taps * g.o));
    for (int64_t o0 = 0; o0 < g.o; o0 += 16) {
      const int64_t width = std::min<int64_t>(16, g.o - o0);
      float* panel = packed.data() + taps * o0;
      for (int64_t t = 0; t < taps; ++t) {
        std::memcpy(panel + t * width, ks + t * g.o + o0, sizeof(float) * width);
      }
    }
    const std::vector<int64_t> offsets = PixelOffsets(g);
    const int64_t blocks = (g.o + 15) / 16;
    const int64_t chunks = (pixels + kPixelsPerTask - 1) / kPixelsPerTask;
    const int64_t units = chunks * blocks;
    ParallelFor(pool, units, units, [&](int64_t, int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t chunk = u / blocks, o0 = 16 * (u % blocks);
        ForwardUnitAvx2(xs, offsets.data(), packed.data(), ys, g, pixels * chunk / chunks,
                        pixels * (chunk + 1) / chunks, o0);
      }
    });
    return ffi::Error::Success();
  }
#endif
  ParallelFor(pool, pixels, (pixels + kPixelsPerTask - 1) / kPixelsPerTask,
              [&](int64_t, int64_t q0, int64_t q1) {
                ForwardPixelsScalar(xs, ks, ys, g, q0, q1);
              });
  return ffi::Error::Success();
}


#ifdef DML_JAX_X86
// The packed form of the kernel gradient (see PackInputBlock): dy packed once (the threads
// split its output blocks), then the threads split the channels, two ranges a thread, each
// summing all pixels into its rows of dk (C >= 256 in the networks: 43 channel tiles at least).
ffi::Error PackedKernelGrad(ffi::ThreadPool& pool, const float* x, const int64_t* offsets,
                            const float* dy, float* dk, const Geometry& g) {
  const int64_t pixels = g.n * g.ho * g.wo;
  std::unique_ptr<float[]> dyp(new float[pixels * g.o]);   // every element written below
  const int64_t blocks = (g.o + 15) / 16;
  ParallelFor(pool, blocks, blocks, [&](int64_t, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) PackOutputGradBlock(dy, g, pixels, 16 * b, dyp.get());
  });
  std::memset(dk, 0, sizeof(float) * g.kh * g.kw * g.c * g.o);
  const int64_t tiles = (g.c + kGradTileRows - 1) / kGradTileRows;
  ParallelFor(pool, tiles, 2 * (pool.num_threads() + 1), [&](int64_t, int64_t t0, int64_t t1) {
    PackedGradRange(x, offsets, dyp.get(), dk, g, pixels, t0 * kGradTileRows,
                    std::min(g.c, t1 * kGradTileRows));
  });
  return ffi::Error::Success();
}
#endif


ffi::Error KernelGradImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                          ffi::Buffer<ffi::F32> dy, int32_t stride_h, int32_t stride_w,
                          int32_t vectorized, int32_t pack, ffi::ResultBuffer<ffi::F32> dk) {
  auto kd = dk->dimensions();
  auto dd = dy.dimensions();
  if (kd.size() != 4 || dd.size() != 4 || kd[2] != x.dimensions()[3]) {
    return ffi::Error::InvalidArgument("conv: dk must be [KH, KW, C, O], C as x's");
  }
  Geometry g;
  if (auto e = MakeGeometry(x, kd[0], kd[1], kd[3], stride_h, stride_w, &g); e.failure()) {
    return e;
  }
  if (dd[0] != g.n || dd[1] != g.ho || dd[2] != g.wo || dd[3] != g.o) {
    return ffi::Error::InvalidArgument("conv: dy must be the forward output's shape");
  }
  const bool avx2 = UseAvx2(vectorized);
  const float *xs = x.typed_data(), *ds = dy.typed_data();
  const int64_t size = g.kh * g.kw * g.c * g.o;
  const int64_t pixels = g.n * g.ho * g.wo;
  const std::vector<int64_t> offsets = PixelOffsets(g);
  const int64_t* off = offsets.data();
  float* out = dk->typed_data();
#ifdef DML_JAX_X86
  if (avx2 && pack != 0) {
    return PackedKernelGrad(pool, xs, off, ds, out, g);
  }
  // Few pixels (x and dy fit in the cache) and so, in a network, many channels: the threads
  // split the kernel gradient by (tap, 16 outputs) and each sums all pixels into its part of
  // dk. Otherwise they split the pixels, each summing into a buffer of its own.
  const int64_t data_bytes = 4 * (g.n * g.h * g.w * g.c + pixels * g.o);
  if (avx2 && data_bytes <= kSplitOutputsBelowBytes) {
    std::memset(out, 0, sizeof(float) * size);
    const int64_t blocks = (g.o + 15) / 16, units = g.kh * g.kw * blocks;
    ParallelFor(pool, units, units, [&](int64_t, int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t tap = u / blocks, o0 = 16 * (u % blocks);
        KernelGradUnitAvx2(xs, off, ds, out, g, 0, pixels, tap / g.kw, tap % g.kw, o0);
      }
    });
    return ffi::Error::Success();
  }
#endif
  // Each part (a range of pixels) sums into its own buffer: several parts per thread balance
  // the threads' work, within kMaxPartialBytes of buffers, each of kMinPixelsPerPart pixels
  // at least.
  const int64_t by_memory = std::max<int64_t>(1, kMaxPartialBytes / (size * 4));
  const int64_t by_pixels = std::max<int64_t>(1, pixels / kMinPixelsPerPart);
  const int64_t parts = std::max<int64_t>(
      1, std::min({4 * (pool.num_threads() + 1), by_memory, by_pixels}));
  std::vector<float> partial(static_cast<size_t>(parts * size), 0.0f);
  ParallelFor(pool, pixels, parts, [&](int64_t part, int64_t q0, int64_t q1) {
    float* acc = partial.data() + part * size;
#ifdef DML_JAX_X86
    if (avx2) {
      // pixel blocks outermost: a block's x and dy stay in the cache for every tap and output
      for (int64_t b0 = q0; b0 < q1; b0 += kGradPixelsPerBlock) {
        const int64_t b1 = std::min(q1, b0 + kGradPixelsPerBlock);
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j)
            for (int64_t o0 = 0; o0 < g.o; o0 += 16)
              KernelGradUnitAvx2(xs, off, ds, acc, g, b0, b1, i, j, o0);
      }
      return;
    }
#endif
    KernelGradPixelsScalar(xs, off, ds, acc, g, q0, q1);
  });
  std::memcpy(out, partial.data(), sizeof(float) * size);
  for (int64_t p = 1; p < parts; ++p) {
    const float* src = partial.data() + p * size;
    for (int64_t e = 0; e < size; ++e) out[e] += src[e];
  }
  return ffi::Error::Success();
}

}  // namespace

// x [N, H, W, C], k [KH, KW, C, O] -> y [N, (H - KH) / SH + 1, (W - KW) / SW + 1, O];
// attributes stride_h, stride_w, vectorized.
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxConvForward, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("stride_h")
                                  .Attr<int32_t>("stride_w")
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::F32>>());

// x [N, H, W, C], dy (y's shape) -> dk [KH, KW, C, O]; strides and vectorized as above;
// pack: nonzero for the packed form (AVX2 only).
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxConvKernelGrad, KernelGradImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("stride_h")
                                  .Attr<int32_t>("stride_w")
                                  .Attr<int32_t>("vectorized")
                                  .Attr<int32_t>("pack")
                                  .Ret<ffi::Buffer<ffi::F32>>());
