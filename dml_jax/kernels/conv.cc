// Direct stride-1 VALID convolutions in NHWC for the CPU (dml_jax.models.conv, conv_impl
// 'auto' on the CPU), as two XLA FFI handlers: the forward convolution (also the input
// gradient, as the convolution of the padded output gradient with the flipped, transposed
// kernel) and the kernel gradient. No patch matrix is formed: the taps are read from the
// input in place by register-blocked AVX2 + FMA micro-kernels.
//
//   forward:  y[n, h, w, o]     = sum_{i, j, c} x[n, h + i, w + j, c] k[i, j, c, o]
//   kernel gradient: dk[i, j, c, o] = sum_{n, h, w} x[n, h + i, w + j, c] dy[n, h, w, o]
//
// x [N, H, W, C] (already padded by the caller), k [KH, KW, C, O], y and dy [N, H - KH + 1,
// W - KW + 1, O], all float32, O a multiple of 8. Work is split over output rows (n, h) on
// XLA's intra-op threads; each thread sums its kernel gradient into its own buffer, and the
// buffers are added at the end. Sums run in another order than XLA's convolution: equal to
// float32 rounding. "vectorized" = 0 runs the scalar form (CPUs without AVX2 + FMA; tests).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DML_JAX_X86 1
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// Register tiles: the loops over a tile's rows and vectors are unrolled early, so that the
// compiler keeps the accumulators in registers.
#define DML_JAX_PRAGMA(x) _Pragma(#x)
#define DML_JAX_UNROLL DML_JAX_PRAGMA(GCC unroll 16)

namespace {

struct Geometry {
  int64_t n, h, w, c;      // input (padded)
  int64_t kh, kw, o;       // kernel
  int64_t ho, wo;          // output
};

// Runs body(first, last) over [0, n) in chunks on the caller and the pool's threads (the
// caller takes chunks too, so the work completes even if no pool thread ever runs a task).
template <typename Body>
void ParallelFor(ffi::ThreadPool& pool, int64_t n, int64_t chunks, const Body& body) {
  chunks = std::max<int64_t>(1, std::min(chunks, n));
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), chunks - 1);
  auto range = [n, chunks](int64_t i) {
    return std::pair<int64_t, int64_t>(n * i / chunks, n * (i + 1) / chunks);
  };
  if (helpers <= 0) {
    for (int64_t i = 0; i < chunks; ++i) body(i, range(i).first, range(i).second);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto state = std::make_shared<State>();
  // A helper that starts after the last chunk was taken touches only the shared state; `body`
  // is read only by whoever takes a chunk, and the caller waits for every taken chunk.
  auto run = [state, chunks, range](const Body* b) {
    for (int64_t i; (i = state->next.fetch_add(1)) < chunks;) {
      (*b)(i, range(i).first, range(i).second);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([run, b = &body] { run(b); });
  run(&body);
  while (state->done.load(std::memory_order_acquire) < chunks) {
#ifdef DML_JAX_X86
    _mm_pause();
#endif
  }
}

// ---- scalar forms ----

void ForwardRowScalar(const float* x, const float* k, float* y, const Geometry& g, int64_t n,
                      int64_t h) {
  float* out = y + ((n * g.ho + h) * g.wo) * g.o;
  std::memset(out, 0, sizeof(float) * g.wo * g.o);
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      const float* xin = x + ((n * g.h + h + i) * g.w + j) * g.c;
      const float* kk = k + (i * g.kw + j) * g.c * g.o;
      for (int64_t w = 0; w < g.wo; ++w) {
        for (int64_t c = 0; c < g.c; ++c) {
          const float a = xin[w * g.c + c];
          for (int64_t o = 0; o < g.o; ++o) out[w * g.o + o] += a * kk[c * g.o + o];
        }
      }
    }
  }
}

void KernelGradRowScalar(const float* x, const float* dy, float* dk, const Geometry& g,
                         int64_t n, int64_t h) {
  const float* d = dy + ((n * g.ho + h) * g.wo) * g.o;
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      const float* xin = x + ((n * g.h + h + i) * g.w + j) * g.c;
      float* kk = dk + (i * g.kw + j) * g.c * g.o;
      for (int64_t w = 0; w < g.wo; ++w) {
        for (int64_t c = 0; c < g.c; ++c) {
          const float a = xin[w * g.c + c];
          for (int64_t o = 0; o < g.o; ++o) kk[c * g.o + o] += a * d[w * g.o + o];
        }
      }
    }
  }
}

// ---- AVX2 + FMA forms ----

#ifdef DML_JAX_X86
// M output pixels x 8 NV output channels of one output row, all taps: y = sum x k.
template <int M, int NV>
__attribute__((target("avx2,fma"))) inline void ForwardTile(const float* x, const float* k,
                                                            float* out, const Geometry& g,
                                                            int64_t n, int64_t h, int64_t w0,
                                                            int64_t o0) {
  __m256 acc[M][NV];
  DML_JAX_UNROLL for (int p = 0; p < M; ++p)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) acc[p][v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      const float* xin = x + ((n * g.h + h + i) * g.w + w0 + j) * g.c;
      const float* kk = k + (i * g.kw + j) * g.c * g.o + o0;
      for (int64_t c = 0; c < g.c; ++c) {
        __m256 b[NV];
        DML_JAX_UNROLL for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(kk + c * g.o + 8 * v);
        DML_JAX_UNROLL for (int p = 0; p < M; ++p) {
          const __m256 a = _mm256_broadcast_ss(xin + p * g.c + c);
          DML_JAX_UNROLL for (int v = 0; v < NV; ++v) acc[p][v] = _mm256_fmadd_ps(a, b[v], acc[p][v]);
        }
      }
    }
  }
  DML_JAX_UNROLL for (int p = 0; p < M; ++p)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + p * g.o + o0 + 8 * v, acc[p][v]);
}

template <int NV>
__attribute__((target("avx2,fma"))) void ForwardRowBlock(const float* x, const float* k,
                                                         float* out, const Geometry& g,
                                                         int64_t n, int64_t h, int64_t o0) {
  constexpr int kM = NV == 2 ? 6 : 12;   // 12 accumulators either way
  int64_t w0 = 0;
  for (; w0 + kM <= g.wo; w0 += kM) ForwardTile<kM, NV>(x, k, out + w0 * g.o, g, n, h, w0, o0);
  switch (g.wo - w0) {  // the row's last pixels, fewer than kM
#define DML_JAX_TAIL(m) \
  case m:               \
    ForwardTile<m, NV>(x, k, out + w0 * g.o, g, n, h, w0, o0); \
    break;
    DML_JAX_TAIL(1) DML_JAX_TAIL(2) DML_JAX_TAIL(3) DML_JAX_TAIL(4) DML_JAX_TAIL(5)
    DML_JAX_TAIL(6) DML_JAX_TAIL(7) DML_JAX_TAIL(8) DML_JAX_TAIL(9) DML_JAX_TAIL(10)
    DML_JAX_TAIL(11)
#undef DML_JAX_TAIL
    default:
      break;
  }
}

__attribute__((target("avx2,fma"))) void ForwardRowAvx2(const float* x, const float* k,
                                                        float* y, const Geometry& g,
                                                        int64_t n, int64_t h) {
  float* out = y + ((n * g.ho + h) * g.wo) * g.o;
  int64_t o0 = 0;
  for (; o0 + 16 <= g.o; o0 += 16) ForwardRowBlock<2>(x, k, out, g, n, h, o0);
  if (o0 < g.o) ForwardRowBlock<1>(x, k, out, g, n, h, o0);   // O % 16 == 8
}

// dk[tap, c0 .. c0 + M, o0 .. o0 + 8 NV] += sum over the pixels of rows [h0, h1) of image n.
template <int M, int NV>
__attribute__((target("avx2,fma"))) inline void KernelGradTile(const float* x,
                                                               const float* dy, float* dk,
                                                               const Geometry& g, int64_t n,
                                                               int64_t h0, int64_t h1,
                                                               int64_t i, int64_t j,
                                                               int64_t c0, int64_t o0) {
  float* kk = dk + ((i * g.kw + j) * g.c + c0) * g.o + o0;
  __m256 acc[M][NV];
  DML_JAX_UNROLL for (int r = 0; r < M; ++r)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_loadu_ps(kk + r * g.o + 8 * v);
  for (int64_t h = h0; h < h1; ++h) {
    const float* xin = x + ((n * g.h + h + i) * g.w + j) * g.c + c0;
    const float* d = dy + ((n * g.ho + h) * g.wo) * g.o + o0;
    for (int64_t w = 0; w < g.wo; ++w) {
      __m256 b[NV];
      DML_JAX_UNROLL for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(d + w * g.o + 8 * v);
      DML_JAX_UNROLL for (int r = 0; r < M; ++r) {
        const __m256 a = _mm256_broadcast_ss(xin + w * g.c + r);
        DML_JAX_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
      }
    }
  }
  DML_JAX_UNROLL for (int r = 0; r < M; ++r)
    DML_JAX_UNROLL for (int v = 0; v < NV; ++v) _mm256_storeu_ps(kk + r * g.o + 8 * v, acc[r][v]);
}

template <int NV>
__attribute__((target("avx2,fma"))) void KernelGradBlock(const float* x, const float* dy,
                                                         float* dk, const Geometry& g,
                                                         int64_t n, int64_t h0, int64_t h1,
                                                         int64_t o0) {
  constexpr int kM = NV == 2 ? 6 : 12;   // 12 accumulators either way
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      int64_t c0 = 0;
      for (; c0 + kM <= g.c; c0 += kM) KernelGradTile<kM, NV>(x, dy, dk, g, n, h0, h1, i, j, c0, o0);
      switch (g.c - c0) {
#define DML_JAX_TAIL(m) \
  case m:               \
    KernelGradTile<m, NV>(x, dy, dk, g, n, h0, h1, i, j, c0, o0); \
    break;
        DML_JAX_TAIL(1) DML_JAX_TAIL(2) DML_JAX_TAIL(3) DML_JAX_TAIL(4) DML_JAX_TAIL(5)
        DML_JAX_TAIL(6) DML_JAX_TAIL(7) DML_JAX_TAIL(8) DML_JAX_TAIL(9) DML_JAX_TAIL(10)
        DML_JAX_TAIL(11)
#undef DML_JAX_TAIL
        default:
          break;
      }
    }
  }
}

// Rows [h0, h1) of image n, every tap, channel and output: into dk.
__attribute__((target("avx2,fma"))) void KernelGradRowsAvx2(const float* x, const float* dy,
                                                            float* dk, const Geometry& g,
                                                            int64_t n, int64_t h0,
                                                            int64_t h1) {
  int64_t o0 = 0;
  for (; o0 + 16 <= g.o; o0 += 16) KernelGradBlock<2>(x, dy, dk, g, n, h0, h1, o0);
  if (o0 < g.o) KernelGradBlock<1>(x, dy, dk, g, n, h0, h1, o0);
}
#endif

bool UseAvx2(int32_t vectorized) {
#ifdef DML_JAX_X86
  return vectorized != 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

ffi::Error MakeGeometry(const ffi::Buffer<ffi::F32>& x, int64_t kh, int64_t kw, int64_t o,
                        Geometry* g) {
  auto d = x.dimensions();
  if (d.size() != 4) return ffi::Error::InvalidArgument("conv: x must be [N, H, W, C]");
  *g = Geometry{d[0], d[1], d[2], d[3], kh, kw, o, d[1] - kh + 1, d[2] - kw + 1};
  if (g->ho < 1 || g->wo < 1 || o % 8 != 0) {
    return ffi::Error::InvalidArgument("conv: the kernel must fit the input, O % 8 == 0");
  }
  return ffi::Error::Success();
}

constexpr int64_t kRowsPerTask = 4;   // output rows (n, h) per task of the forward pass

ffi::Error ForwardImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> k,
                       int32_t vectorized, ffi::ResultBuffer<ffi::F32> y) {
  auto kd = k.dimensions();
  if (kd.size() != 4 || kd[2] != x.dimensions()[3]) {
    return ffi::Error::InvalidArgument("conv: k must be [KH, KW, C, O], C as x's");
  }
  Geometry g;
  if (auto e = MakeGeometry(x, kd[0], kd[1], kd[3], &g); e.failure()) return e;
  const bool avx2 = UseAvx2(vectorized);
  const float *xs = x.typed_data(), *ks = k.typed_data();
  float* ys = y->typed_data();
  const int64_t rows = g.n * g.ho;
  ParallelFor(pool, rows, (rows + kRowsPerTask - 1) / kRowsPerTask,
              [&](int64_t, int64_t r0, int64_t r1) {
                for (int64_t r = r0; r < r1; ++r) {
#ifdef DML_JAX_X86
                  if (avx2) {
                    ForwardRowAvx2(xs, ks, ys, g, r / g.ho, r % g.ho);
                    continue;
                  }
#endif
                  ForwardRowScalar(xs, ks, ys, g, r / g.ho, r % g.ho);
                }
              });
  return ffi::Error::Success();
}

constexpr int64_t kGradRowsPerBlock = 4;   // rows summed per register tile of dk
constexpr int64_t kMaxPartialBytes = 64 << 20;

ffi::Error KernelGradImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                          ffi::Buffer<ffi::F32> dy, int32_t vectorized,
                          ffi::ResultBuffer<ffi::F32> dk) {
  auto kd = dk->dimensions();
  auto dd = dy.dimensions();
  if (kd.size() != 4 || dd.size() != 4 || kd[2] != x.dimensions()[3]) {
    return ffi::Error::InvalidArgument("conv: dk must be [KH, KW, C, O], C as x's");
  }
  Geometry g;
  if (auto e = MakeGeometry(x, kd[0], kd[1], kd[3], &g); e.failure()) return e;
  if (dd[0] != g.n || dd[1] != g.ho || dd[2] != g.wo || dd[3] != g.o) {
    return ffi::Error::InvalidArgument("conv: dy must be [N, H - KH + 1, W - KW + 1, O]");
  }
  const bool avx2 = UseAvx2(vectorized);
  const float *xs = x.typed_data(), *ds = dy.typed_data();
  const int64_t size = g.kh * g.kw * g.c * g.o;
  // Each part (a range of rows) sums into its own buffer: several parts per thread balance the
  // threads' work, within kMaxPartialBytes of buffers.
  const int64_t by_memory = std::max<int64_t>(1, kMaxPartialBytes / (size * 4));
  const int64_t parts = std::max<int64_t>(
      1, std::min({g.n * g.ho, 4 * (pool.num_threads() + 1), by_memory}));
  std::vector<float> partial(static_cast<size_t>(parts * size), 0.0f);
  const int64_t rows = g.n * g.ho;
  ParallelFor(pool, rows, parts, [&](int64_t part, int64_t r0, int64_t r1) {
    float* acc = partial.data() + part * size;
    // blocks of up to kGradRowsPerBlock rows of one image
    for (int64_t r = r0; r < r1;) {
      const int64_t n = r / g.ho, h0 = r % g.ho;
      const int64_t h1 = std::min({g.ho, h0 + kGradRowsPerBlock, h0 + (r1 - r)});
#ifdef DML_JAX_X86
      if (avx2) {
        KernelGradRowsAvx2(xs, ds, acc, g, n, h0, h1);
        r += h1 - h0;
        continue;
      }
#endif
      for (int64_t h = h0; h < h1; ++h) KernelGradRowScalar(xs, ds, acc, g, n, h);
      r += h1 - h0;
    }
  });
  float* out = dk->typed_data();
  std::memcpy(out, partial.data(), sizeof(float) * size);
  for (int64_t p = 1; p < parts; ++p) {
    const float* src = partial.data() + p * size;
    for (int64_t e = 0; e < size; ++e) out[e] += src[e];
  }
  return ffi::Error::Success();
}

}  // namespace

// x [N, H, W, C], k [KH, KW, C, O] -> y [N, H - KH + 1, W - KW + 1, O]; attribute vectorized.
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxConvForward, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::F32>>());

// x [N, H, W, C], dy [N, H - KH + 1, W - KW + 1, O] -> dk [KH, KW, C, O]; vectorized.
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxConvKernelGrad, KernelGradImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::F32>>());
