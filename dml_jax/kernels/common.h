// What the CPU kernels of dml_jax share (included by the sources beside this file).
#ifndef DML_JAX_KERNELS_COMMON_H_
#define DML_JAX_KERNELS_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DML_JAX_X86 1
#endif

#include "xla/ffi/api/ffi.h"

namespace dml_jax {

// Register tiles: the loops over a tile's rows and vectors are unrolled early, so that the
// compiler keeps the accumulators in registers.
#define DML_JAX_PRAGMA(x) _Pragma(#x)
#define DML_JAX_UNROLL DML_JAX_PRAGMA(GCC unroll 16)

// Runs body(i, first, last) for the chunks i = 0 .. chunks - 1 of [0, n) (equal ranges) on
// the caller and the pool's threads (the caller takes chunks too, so the work completes even
// if no pool thread ever runs a task).
template <typename Body>
inline void ParallelFor(xla::ffi::ThreadPool& pool, int64_t n, int64_t chunks,
                        const Body& body) {
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

// Calls f(std::integral_constant<int, m>()) for a runtime m in [1, 11]: the last rows of a
// register tile (fewer than a full tile's), as a compile-time size; nothing for other m.
template <typename F>
inline void WithTailSize(int64_t m, F&& f) {
  switch (m) {
#define DML_JAX_TAIL(k) \
  case k:               \
    f(std::integral_constant<int, k>());    \
    break;
    DML_JAX_TAIL(1) DML_JAX_TAIL(2) DML_JAX_TAIL(3) DML_JAX_TAIL(4) DML_JAX_TAIL(5)
    DML_JAX_TAIL(6) DML_JAX_TAIL(7) DML_JAX_TAIL(8) DML_JAX_TAIL(9) DML_JAX_TAIL(10)
    DML_JAX_TAIL(11)
#undef DML_JAX_TAIL
    default:
      break;
  }
}

// Whether to take the AVX2 + FMA forms: asked for (vectorized != 0) and the CPU has them.
inline bool UseAvx2(int32_t vectorized) {
#ifdef DML_JAX_X86
  return vectorized != 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace dml_jax

#endif  // DML_JAX_KERNELS_COMMON_H_
