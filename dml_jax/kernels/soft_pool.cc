// SoftTriple's soft maximum over a class's K centres (dml_jax.objectives._softmax._soft_pool)
// as two XLA FFI handlers, forward and backward, each one pass over the cosines.
//
// cos [..., K * C] (column k * C + c; every leading axis a batch axis), temperature gamma:
//   e_kc = exp((cos_kc - shift_c) / gamma),  z_c = sum_k e_kc,  pooled_c = sum_k e_kc cos_kc / z_c
// with shift_c = 1 (the cosine's bound; "max_shift" = 0) or max_k cos_kc ("max_shift" = 1).
// Forward returns pooled and z [..., C]; backward, from the cotangent g of pooled, returns
// dcos_kc = g_c / z_c * e_kc * (1 + (cos_kc - pooled_c) / gamma), with the shift and e
// recomputed exactly as in the forward pass (nothing of size K x C is stored between them
// but the cosines, which dcos overwrites).
//
// The pass runs along C, 8 lanes at a time with AVX2 + FMA where the CPU has them (exp by a
// degree-6 polynomial after range reduction, within 2 ulp of the correctly rounded value), on
// the threads of XLA's intra-op pool; "vectorized" = 0 forces the scalar form (std::exp).

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common.h"

namespace ffi = xla::ffi;
using dml_jax::ParallelFor;
using dml_jax::UseAvx2;

namespace {

constexpr float kExpLowest = -87.33654f;   // below: exp underflows float32's normal range

struct Shape {
  int64_t rows, k, c;  // rows = product of the leading axes
};

// ---- scalar form (the tail of every row, and CPUs without AVX2) ----

inline float ShiftOf(const float* cos, const Shape& s, int64_t c, bool max_shift) {
  if (!max_shift) return 1.0f;
  float m = cos[c];
  for (int64_t k = 1; k < s.k; ++k) m = std::max(m, cos[k * s.c + c]);
  return m;
}

inline float ExpScalar(float x) { return x < kExpLowest ? 0.0f : std::exp(x); }

void ForwardScalar(const float* cos, const Shape& s, int64_t c0, int64_t c1, float inv_gamma,
                   bool max_shift, float* pooled, float* z) {
  for (int64_t c = c0; c < c1; ++c) {
    const float sh = ShiftOf(cos, s, c, max_shift);
    float zs = 0.0f, ws = 0.0f;
    for (int64_t k = 0; k < s.k; ++k) {
      const float v = cos[k * s.c + c];
      const float e = ExpScalar((v - sh) * inv_gamma);
      zs += e;
      ws += e * v;
    }
    pooled[c] = ws / zs;
    z[c] = zs;
  }
}

void BackwardScalar(const float* cos, const Shape& s, int64_t c0, int64_t c1, float inv_gamma,
                    bool max_shift, const float* g, const float* pooled, const float* z,
                    float* dcos) {
  for (int64_t c = c0; c < c1; ++c) {
    const float w = g[c] / z[c], sh = ShiftOf(cos, s, c, max_shift);
    for (int64_t k = 0; k < s.k; ++k) {
      const float v = cos[k * s.c + c];
      const float e = ExpScalar((v - sh) * inv_gamma);
      dcos[k * s.c + c] = w * e * (1.0f + (v - pooled[c]) * inv_gamma);
    }
  }
}

// ---- AVX2 + FMA form ----

#ifdef DML_JAX_X86
__attribute__((target("avx2,fma"))) inline __m256 Exp8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(kExpLowest);
  const __m256 under = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lowest), _mm256_set1_ps(88.37626f));
  // x = n ln2 + r, |r| <= ln2 / 2 (ln2 split in two for an exact product)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  // exp(r) = 1 + r + r^2 P(r), Cephes' expf coefficients
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // times 2^n (n in [-126, 127] after the clamp)
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 out = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  return _mm256_andnot_ps(under, out);
}

__attribute__((target("avx2,fma"))) inline __m256 Shift8(const float* cos, const Shape& s,
                                                       int64_t c, bool max_shift) {
  if (!max_shift) return _mm256_set1_ps(1.0f);
  __m256 m = _mm256_loadu_ps(cos + c);
  for (int64_t k = 1; k < s.k; ++k) m = _mm256_max_ps(m, _mm256_loadu_ps(cos + k * s.c + c));
  return m;
}

__attribute__((target("avx2,fma"))) void ForwardAvx2(const float* cos, const Shape& s,
                                                     float inv_gamma, bool max_shift,
                                                     float* pooled, float* z) {
  const int64_t full = s.c / 8 * 8;
  const __m256 ig = _mm256_set1_ps(inv_gamma);
  for (int64_t c = 0; c < full; c += 8) {
    const __m256 sh = Shift8(cos, s, c, max_shift);
    __m256 zs = _mm256_setzero_ps(), ws = _mm256_setzero_ps();
    for (int64_t k = 0; k < s.k; ++k) {
      const __m256 v = _mm256_loadu_ps(cos + k * s.c + c);
      const __m256 e = Exp8(_mm256_mul_ps(_mm256_sub_ps(v, sh), ig));
      zs = _mm256_add_ps(zs, e);
      ws = _mm256_fmadd_ps(e, v, ws);
    }
    _mm256_storeu_ps(pooled + c, _mm256_div_ps(ws, zs));
    _mm256_storeu_ps(z + c, zs);
  }
  ForwardScalar(cos, s, full, s.c, inv_gamma, max_shift, pooled, z);
}

__attribute__((target("avx2,fma"))) void BackwardAvx2(const float* cos, const Shape& s,
                                                      float inv_gamma, bool max_shift,
                                                      const float* g, const float* pooled,
                                                      const float* z, float* dcos) {
  const int64_t full = s.c / 8 * 8;
  const __m256 ig = _mm256_set1_ps(inv_gamma), one = _mm256_set1_ps(1.0f);
  for (int64_t c = 0; c < full; c += 8) {
    const __m256 w = _mm256_div_ps(_mm256_loadu_ps(g + c), _mm256_loadu_ps(z + c));
    const __m256 sh = Shift8(cos, s, c, max_shift), pc = _mm256_loadu_ps(pooled + c);
    for (int64_t k = 0; k < s.k; ++k) {
      const __m256 v = _mm256_loadu_ps(cos + k * s.c + c);
      const __m256 e = Exp8(_mm256_mul_ps(_mm256_sub_ps(v, sh), ig));
      const __m256 f = _mm256_fmadd_ps(_mm256_sub_ps(v, pc), ig, one);
      _mm256_storeu_ps(dcos + k * s.c + c, _mm256_mul_ps(_mm256_mul_ps(w, e), f));
    }
  }
  BackwardScalar(cos, s, full, s.c, inv_gamma, max_shift, g, pooled, z, dcos);
}
#endif


ffi::Error ShapeOf(const ffi::Buffer<ffi::F32>& cos, int32_t k, Shape* s) {
  auto d = cos.dimensions();
  if (d.size() < 1 || k < 1 || d.back() % k != 0) {
    return ffi::Error::InvalidArgument("soft_pool: cos must be [..., K * C] with K = centres");
  }
  s->k = k;
  s->c = d.back() / k;
  s->rows = 1;
  for (size_t i = 0; i + 1 < d.size(); ++i) s->rows *= d[i];
  return ffi::Error::Success();
}

constexpr int64_t kGrainElements = 1 << 16;   // cosines per task

ffi::Error ForwardImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> cos, int32_t centres,
                       float gamma, int32_t max_shift, int32_t vectorized,
                       ffi::ResultBuffer<ffi::F32> kept, ffi::ResultBuffer<ffi::F32> pooled,
                       ffi::ResultBuffer<ffi::F32> z) {
  Shape s;
  if (auto e = ShapeOf(cos, centres, &s); e.failure()) return e;
  if (kept->typed_data() != cos.typed_data()) {   // not aliased by the caller: copy
    std::copy_n(cos.typed_data(), cos.element_count(), kept->typed_data());
  }
  const float inv_gamma = 1.0f / gamma;
  const bool avx2 = UseAvx2(vectorized);
  const float* x = cos.typed_data();
  float *p = pooled->typed_data(), *zz = z->typed_data();
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, s.k * s.c));
  const int64_t chunks = (s.rows + grain - 1) / grain;
  ParallelFor(pool, s.rows, chunks, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * s.k * s.c;
      float *pr = p + r * s.c, *zr = zz + r * s.c;
#ifdef DML_JAX_X86
      if (avx2) {
        ForwardAvx2(xr, s, inv_gamma, max_shift != 0, pr, zr);
        continue;
      }
#endif
      ForwardScalar(xr, s, 0, s.c, inv_gamma, max_shift != 0, pr, zr);
    }
  });
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> cos,
                        ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> pooled,
                        ffi::Buffer<ffi::F32> z, int32_t centres, float gamma,
                        int32_t max_shift, int32_t vectorized,
                        ffi::ResultBuffer<ffi::F32> dcos) {
  Shape s;
  if (auto e = ShapeOf(cos, centres, &s); e.failure()) return e;
  const int64_t n = s.rows * s.c;
  if (static_cast<int64_t>(g.element_count()) != n ||
      static_cast<int64_t>(pooled.element_count()) != n ||
      static_cast<int64_t>(z.element_count()) != n) {
    return ffi::Error::InvalidArgument("soft_pool: g, pooled and z must be [..., C]");
  }
  const float inv_gamma = 1.0f / gamma;
  const bool avx2 = UseAvx2(vectorized);
  const float *x = cos.typed_data(), *gg = g.typed_data(), *p = pooled.typed_data(),
              *zz = z.typed_data();
  float* out = dcos->typed_data();
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, s.k * s.c));
  const int64_t chunks = (s.rows + grain - 1) / grain;
  ParallelFor(pool, s.rows, chunks, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t a = r * s.k * s.c, b = r * s.c;
#ifdef DML_JAX_X86
      if (avx2) {
        BackwardAvx2(x + a, s, inv_gamma, max_shift != 0, gg + b, p + b, zz + b, out + a);
        continue;
      }
#endif
      BackwardScalar(x + a, s, 0, s.c, inv_gamma, max_shift != 0, gg + b, p + b, zz + b,
                     out + a);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

// cos [..., K * C] (column k * C + c) -> (cos, pooled, z [..., C]); attributes centres (K),
// gamma, max_shift, vectorized. The first result is the input passed through (the caller
// aliases it to the input, so nothing is copied) for the backward pass to overwrite: XLA
// copies an operand that a custom call overwrites unless that call is its only reader.
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxSoftPoolForward, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("centres")
                                  .Attr<float>("gamma")
                                  .Attr<int32_t>("max_shift")
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// (cos [..., K * C], g, pooled, z [..., C]) -> dcos [..., K * C]; centres, gamma, max_shift,
// vectorized. dcos may be cos's own buffer: each column's shift and each element are read
// before that element is written.
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxSoftPoolBackward, BackwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("centres")
                                  .Attr<float>("gamma")
                                  .Attr<int32_t>("max_shift")
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::F32>>());
