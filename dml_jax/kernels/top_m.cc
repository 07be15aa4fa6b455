// The tile merge of dml_jax.evaluation.top_m as one pass over the tile (an XLA FFI handler).
//
// Every query keeps its best m gallery items so far, values float32 [rows, m] by decreasing
// similarity and gallery indices int32 [rows, m]; unfilled places hold (-inf, -1). A tile
// S [R, G] of similarities (query r of block a, gallery column c of block b) is merged into
// the best of its rows ("rows") and, for the symmetric search, read as its transpose into
// the best of its columns ("both": column c is a query of block b, row r its gallery item).
//
// Exact, with the tie rule of the search: the tile's items come after the running best in
// gallery order, so an item enters only when its value is strictly above the m-th best, and
// it is placed after the items of equal value (they have lower gallery indices). Within a
// tile the items are visited in increasing gallery index for both directions.
//
// Values are sanitised as top_m.sanitize does for the XLA path: NaN and -inf become the
// lowest finite float32, +inf the highest (so the oracle's clipping holds), and pairs masked
// out (padding: an index >= num_items; self: equal indices when exclude_self) never enter.
// -0.0 and +0.0 compare equal, which is the lower-index rule again.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DML_JAX_X86 1
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline float Sanitize(float x) {
  if (!(x >= -FLT_MAX)) return -FLT_MAX;  // NaN, -inf
  return x > FLT_MAX ? FLT_MAX : x;
}

// Inserts (x, index) into the sorted list (values, indices)[0:m], x > values[m - 1].
inline void Insert(float* values, int32_t* indices, int64_t m, float x, int32_t index) {
  int64_t p = m - 1;
  while (p > 0 && values[p - 1] < x) {
    values[p] = values[p - 1];
    indices[p] = indices[p - 1];
    --p;
  }
  values[p] = x;
  indices[p] = index;
}

struct Tile {
  const float* s;     // [rows, cols]
  int64_t rows, cols, m;
  int64_t valid_rows, valid_cols;  // rows merged; columns below num_items
  int64_t self_offset;             // column of row r's self pair is r + self_offset; or none
  bool exclude_self;
  int32_t a_start, b_start;
  float* row_values;               // [rows, m]
  int32_t* row_indices;
  float* col_values;               // [cols, m] or null ("rows" only)
  int32_t* col_indices;
};

// One row r, items [c0, c1): the scalar form of the merge (the tail, and CPUs without AVX2).
inline void MergeScalar(const Tile& t, int64_t r, int64_t c0, int64_t c1, float* col_thr) {
  const float* row = t.s + r * t.cols;
  float* rv = t.row_values + r * t.m;
  int32_t* ri = t.row_indices + r * t.m;
  const int64_t self_col = t.exclude_self ? r + t.self_offset : -1;
  for (int64_t c = c0; c < c1; ++c) {
    if (c == self_col) continue;
    const float x = Sanitize(row[c]);
    if (x > rv[t.m - 1]) Insert(rv, ri, t.m, x, t.b_start + static_cast<int32_t>(c));
    if (t.col_values != nullptr && x > col_thr[c]) {
      float* cv = t.col_values + c * t.m;
      Insert(cv, t.col_indices + c * t.m, t.m, x, t.a_start + static_cast<int32_t>(r));
      col_thr[c] = cv[t.m - 1];
    }
  }
}

void MergeGeneric(const Tile& t, float* col_thr) {
  for (int64_t r = 0; r < t.valid_rows; ++r) MergeScalar(t, r, 0, t.valid_cols, col_thr);
}

#ifdef DML_JAX_X86
__attribute__((target("avx2"))) void MergeAvx2(const Tile& t, float* col_thr) {
  const __m256 lowest = _mm256_set1_ps(-FLT_MAX), highest = _mm256_set1_ps(FLT_MAX);
  const int64_t full = t.valid_cols / 8 * 8;
  const bool both = t.col_values != nullptr;
  alignas(32) float x[8];
  for (int64_t r = 0; r < t.valid_rows; ++r) {
    const float* row = t.s + r * t.cols;
    float* rv = t.row_values + r * t.m;
    int32_t* ri = t.row_indices + r * t.m;
    const int64_t self_col = t.exclude_self ? r + t.self_offset : -1;
    for (int64_t c = 0; c < full; c += 8) {
      // max(v, lowest) maps NaN (and -inf) to lowest: the second operand is returned on NaN.
      __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(row + c), lowest), highest);
      unsigned row_bits = static_cast<unsigned>(_mm256_movemask_ps(
          _mm256_cmp_ps(v, _mm256_set1_ps(rv[t.m - 1]), _CMP_GT_OQ)));
      unsigned col_bits = both ? static_cast<unsigned>(_mm256_movemask_ps(
          _mm256_cmp_ps(v, _mm256_loadu_ps(col_thr + c), _CMP_GT_OQ))) : 0u;
      if ((row_bits | col_bits) == 0) continue;
      _mm256_store_ps(x, v);
      for (unsigned bits = row_bits; bits != 0; bits &= bits - 1) {
        const int lane = __builtin_ctz(bits);
        const int64_t col = c + lane;
        // the threshold rises as this row's items enter, so it is tested again
        if (col != self_col && x[lane] > rv[t.m - 1]) {
          Insert(rv, ri, t.m, x[lane], t.b_start + static_cast<int32_t>(col));
        }
      }
      for (unsigned bits = col_bits; bits != 0; bits &= bits - 1) {
        const int lane = __builtin_ctz(bits);
        const int64_t col = c + lane;
        if (col == self_col) continue;
        float* cv = t.col_values + col * t.m;
        Insert(cv, t.col_indices + col * t.m, t.m, x[lane], t.a_start + static_cast<int32_t>(r));
        col_thr[col] = cv[t.m - 1];
      }
    }
    MergeScalar(t, r, full, t.valid_cols, col_thr);
  }
}
#endif

// vectorized = 0 takes the scalar form on any CPU (tests compare the two).
void Merge(const Tile& t, bool vectorized) {
  std::vector<float> col_thr;
  if (t.col_values != nullptr) {
    col_thr.resize(static_cast<size_t>(t.cols));
    for (int64_t c = 0; c < t.cols; ++c) col_thr[c] = t.col_values[c * t.m + t.m - 1];
  }
#ifdef DML_JAX_X86
  if (vectorized && __builtin_cpu_supports("avx2")) {
    MergeAvx2(t, col_thr.data());
    return;
  }
#endif
  MergeGeneric(t, col_thr.data());
}

int64_t Clamp(int64_t x, int64_t hi) { return x < 0 ? 0 : (x > hi ? hi : x); }

template <typename T, ffi::DataType D>
void CopyIfNotAliased(const ffi::Buffer<D>& in, ffi::ResultBuffer<D>& out) {
  if (out->untyped_data() != in.untyped_data()) {
    std::memcpy(out->untyped_data(), in.untyped_data(), in.size_bytes());
  }
}

ffi::Error CheckBest(const ffi::Buffer<ffi::F32>& values, const ffi::Buffer<ffi::S32>& indices,
                     int64_t rows) {
  auto v = values.dimensions(), i = indices.dimensions();
  if (v.size() != 2 || i.size() != 2 || v[0] != rows || i[0] != rows || v[1] != i[1] ||
      v[1] < 1) {
    return ffi::Error::InvalidArgument("top_m merge: best values / indices must be [n, m], "
                                       "n matching the tile");
  }
  return ffi::Error::Success();
}

// The rows are queries; in the "both" form they are also gallery items (of the same set), so
// rows at or above num_items are padding there. A padded query row of the "rows" form is
// merged like any other (its result is discarded).
Tile MakeTile(const ffi::Buffer<ffi::F32>& s, int64_t m, int32_t a_start, int32_t b_start,
              int32_t num_items, bool exclude_self, bool rows_are_items) {
  auto d = s.dimensions();
  Tile t{};
  t.s = s.typed_data();
  t.rows = d[0];
  t.cols = d[1];
  t.m = m;
  t.a_start = a_start;
  t.b_start = b_start;
  t.valid_rows = rows_are_items ? Clamp(static_cast<int64_t>(num_items) - a_start, t.rows)
                                : t.rows;
  t.valid_cols = Clamp(static_cast<int64_t>(num_items) - b_start, t.cols);
  t.exclude_self = exclude_self;
  t.self_offset = static_cast<int64_t>(a_start) - b_start;
  return t;
}

ffi::Error MergeRowsImpl(ffi::Buffer<ffi::F32> s, ffi::Buffer<ffi::F32> values,
                         ffi::Buffer<ffi::S32> indices, ffi::Buffer<ffi::S32> starts,
                         int32_t exclude_self, int32_t vectorized,
                         ffi::ResultBuffer<ffi::F32> out_values,
                         ffi::ResultBuffer<ffi::S32> out_indices) {
  if (s.dimensions().size() != 2 || starts.element_count() != 3) {
    return ffi::Error::InvalidArgument("top_m merge: s must be [R, G], starts [3]");
  }
  if (auto e = CheckBest(values, indices, s.dimensions()[0]); e.failure()) return e;
  CopyIfNotAliased<float>(values, out_values);
  CopyIfNotAliased<int32_t>(indices, out_indices);
  const int32_t* st = starts.typed_data();
  Tile t = MakeTile(s, values.dimensions()[1], st[0], st[1], st[2], exclude_self != 0, false);
  t.row_values = out_values->typed_data();
  t.row_indices = out_indices->typed_data();
  Merge(t, vectorized != 0);
  return ffi::Error::Success();
}

ffi::Error MergeBothImpl(ffi::Buffer<ffi::F32> s, ffi::Buffer<ffi::F32> a_values,
                         ffi::Buffer<ffi::S32> a_indices, ffi::Buffer<ffi::F32> b_values,
                         ffi::Buffer<ffi::S32> b_indices, ffi::Buffer<ffi::S32> starts,
                         int32_t vectorized, ffi::ResultBuffer<ffi::F32> out_a_values,
                         ffi::ResultBuffer<ffi::S32> out_a_indices,
                         ffi::ResultBuffer<ffi::F32> out_b_values,
                         ffi::ResultBuffer<ffi::S32> out_b_indices) {
  if (s.dimensions().size() != 2 || starts.element_count() != 3) {
    return ffi::Error::InvalidArgument("top_m merge: s must be [R, G], starts [3]");
  }
  if (auto e = CheckBest(a_values, a_indices, s.dimensions()[0]); e.failure()) return e;
  if (auto e = CheckBest(b_values, b_indices, s.dimensions()[1]); e.failure()) return e;
  if (a_values.dimensions()[1] != b_values.dimensions()[1]) {
    return ffi::Error::InvalidArgument("top_m merge: both sides must keep the same m");
  }
  CopyIfNotAliased<float>(a_values, out_a_values);
  CopyIfNotAliased<int32_t>(a_indices, out_a_indices);
  CopyIfNotAliased<float>(b_values, out_b_values);
  CopyIfNotAliased<int32_t>(b_indices, out_b_indices);
  const int32_t* st = starts.typed_data();
  Tile t = MakeTile(s, a_values.dimensions()[1], st[0], st[1], st[2], false, true);
  t.row_values = out_a_values->typed_data();
  t.row_indices = out_a_indices->typed_data();
  t.col_values = out_b_values->typed_data();
  t.col_indices = out_b_indices->typed_data();
  Merge(t, vectorized != 0);
  return ffi::Error::Success();
}


// ---------------------------------------------------------------------------------- ranks
// The counts of top_m.top_m_and_ranks: every query (row, and in the "both" form also every
// column) names a target item and its expected similarity v. Each item x of the tile other
// than the target (self and padding excluded) adds to the query's counts: [0] x > v,
// [1] x == v, [2] x >= v and of the query's class; the target's own similarity is read into
// `read` (a max). Only items with x >= v need more than one comparison (few, once v is a
// good item's similarity).

struct Side {
  const float* value;    // [n] expected similarity of each query's target
  const int32_t* target; // [n] the target's item index
  const int32_t* code;   // [n] the query's label code
  int32_t* counts;       // [n, 3]
  float* read;           // [n]
};

inline void CountOne(const Side& q, int64_t qi, float x, int32_t item, int32_t item_code) {
  if (item == q.target[qi]) {
    if (x > q.read[qi]) q.read[qi] = x;
    return;
  }
  const float v = q.value[qi];
  int32_t* c = q.counts + 3 * qi;
  if (x > v) ++c[0];
  if (x == v) ++c[1];
  if (item_code == q.code[qi]) ++c[2];  // x >= v here
}

struct CountTile {
  const float* s;
  int64_t rows, cols, valid_rows, valid_cols, self_offset;
  bool exclude_self;
  int32_t a_start, b_start;
  Side a;                    // queries of the rows
  const int32_t* col_codes;  // [cols] codes of the column items
  Side b;                    // queries of the columns (value null: rows only)
};

inline void CountScalar(const CountTile& t, int64_t r, int64_t c0, int64_t c1) {
  const float* row = t.s + r * t.cols;
  const int64_t self_col = t.exclude_self ? r + t.self_offset : -1;
  const float va = t.a.value[r];
  for (int64_t c = c0; c < c1; ++c) {
    if (c == self_col) continue;
    const float x = Sanitize(row[c]);
    if (x >= va) CountOne(t.a, r, x, t.b_start + static_cast<int32_t>(c), t.col_codes[c]);
    if (t.b.value != nullptr && x >= t.b.value[c]) {
      CountOne(t.b, c, x, t.a_start + static_cast<int32_t>(r), t.a.code[r]);
    }
  }
}

#ifdef DML_JAX_X86
__attribute__((target("avx2"))) void CountAvx2(const CountTile& t) {
  const __m256 lowest = _mm256_set1_ps(-FLT_MAX), highest = _mm256_set1_ps(FLT_MAX);
  const int64_t full = t.valid_cols / 8 * 8;
  const bool both = t.b.value != nullptr;
  alignas(32) float x[8];
  for (int64_t r = 0; r < t.valid_rows; ++r) {
    const float* row = t.s + r * t.cols;
    const int64_t self_col = t.exclude_self ? r + t.self_offset : -1;
    const __m256 va = _mm256_set1_ps(t.a.value[r]);
    for (int64_t c = 0; c < full; c += 8) {
      __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(row + c), lowest), highest);
      unsigned row_bits = static_cast<unsigned>(
          _mm256_movemask_ps(_mm256_cmp_ps(v, va, _CMP_GE_OQ)));
      unsigned col_bits = both ? static_cast<unsigned>(_mm256_movemask_ps(
          _mm256_cmp_ps(v, _mm256_loadu_ps(t.b.value + c), _CMP_GE_OQ))) : 0u;
      if ((row_bits | col_bits) == 0) continue;
      _mm256_store_ps(x, v);
      for (unsigned bits = row_bits; bits != 0; bits &= bits - 1) {
        const int64_t col = c + __builtin_ctz(bits);
        if (col != self_col) {
          CountOne(t.a, r, x[col - c], t.b_start + static_cast<int32_t>(col), t.col_codes[col]);
        }
      }
      for (unsigned bits = col_bits; bits != 0; bits &= bits - 1) {
        const int64_t col = c + __builtin_ctz(bits);
        if (col != self_col) {
          CountOne(t.b, col, x[col - c], t.a_start + static_cast<int32_t>(r), t.a.code[r]);
        }
      }
    }
    CountScalar(t, r, full, t.valid_cols);
  }
}
#endif

void Count(const CountTile& t, bool vectorized) {
#ifdef DML_JAX_X86
  if (vectorized && __builtin_cpu_supports("avx2")) {
    CountAvx2(t);
    return;
  }
#endif
  for (int64_t r = 0; r < t.valid_rows; ++r) CountScalar(t, r, 0, t.valid_cols);
}

ffi::Error CheckSide(const ffi::Buffer<ffi::F32>& value, const ffi::Buffer<ffi::S32>& target,
                     const ffi::Buffer<ffi::S32>& code, const ffi::Buffer<ffi::S32>& counts,
                     const ffi::Buffer<ffi::F32>& read, int64_t n) {
  if (value.element_count() != n || target.element_count() != n || code.element_count() != n ||
      counts.element_count() != 3 * n || read.element_count() != n) {
    return ffi::Error::InvalidArgument("top_m ranks: value, target, code, read must be [n] and "
                                       "counts [n, 3], n matching the tile");
  }
  return ffi::Error::Success();
}

Side MakeSide(const ffi::Buffer<ffi::F32>& value, const ffi::Buffer<ffi::S32>& target,
              const ffi::Buffer<ffi::S32>& code, const ffi::Buffer<ffi::S32>& counts,
              const ffi::Buffer<ffi::F32>& read, ffi::ResultBuffer<ffi::S32>& out_counts,
              ffi::ResultBuffer<ffi::F32>& out_read) {
  CopyIfNotAliased<int32_t>(counts, out_counts);
  CopyIfNotAliased<float>(read, out_read);
  return Side{value.typed_data(), target.typed_data(), code.typed_data(),
              out_counts->typed_data(), out_read->typed_data()};
}

ffi::Error CountRowsImpl(ffi::Buffer<ffi::F32> s, ffi::Buffer<ffi::S32> starts,
                         ffi::Buffer<ffi::F32> value, ffi::Buffer<ffi::S32> target,
                         ffi::Buffer<ffi::S32> code, ffi::Buffer<ffi::S32> col_codes,
                         ffi::Buffer<ffi::S32> counts, ffi::Buffer<ffi::F32> read,
                         int32_t exclude_self, int32_t vectorized,
                         ffi::ResultBuffer<ffi::S32> out_counts,
                         ffi::ResultBuffer<ffi::F32> out_read) {
  if (s.dimensions().size() != 2 || starts.element_count() != 3) {
    return ffi::Error::InvalidArgument("top_m ranks: s must be [R, G], starts [3]");
  }
  const int64_t rows = s.dimensions()[0], cols = s.dimensions()[1];
  if (auto e = CheckSide(value, target, code, counts, read, rows); e.failure()) return e;
  if (col_codes.element_count() != cols) {
    return ffi::Error::InvalidArgument("top_m ranks: column codes must be [G]");
  }
  const int32_t* st = starts.typed_data();
  CountTile t{};
  t.s = s.typed_data();
  t.rows = rows;
  t.cols = cols;
  t.valid_rows = rows;
  t.valid_cols = Clamp(static_cast<int64_t>(st[2]) - st[1], cols);
  t.a_start = st[0];
  t.b_start = st[1];
  t.exclude_self = exclude_self != 0;
  t.self_offset = static_cast<int64_t>(st[0]) - st[1];
  t.a = MakeSide(value, target, code, counts, read, out_counts, out_read);
  t.col_codes = col_codes.typed_data();
  Count(t, vectorized != 0);
  return ffi::Error::Success();
}

ffi::Error CountBothImpl(ffi::Buffer<ffi::F32> s, ffi::Buffer<ffi::S32> starts,
                         ffi::Buffer<ffi::F32> a_value, ffi::Buffer<ffi::S32> a_target,
                         ffi::Buffer<ffi::S32> a_code, ffi::Buffer<ffi::S32> a_counts,
                         ffi::Buffer<ffi::F32> a_read, ffi::Buffer<ffi::F32> b_value,
                         ffi::Buffer<ffi::S32> b_target, ffi::Buffer<ffi::S32> b_code,
                         ffi::Buffer<ffi::S32> b_counts, ffi::Buffer<ffi::F32> b_read,
                         int32_t vectorized, ffi::ResultBuffer<ffi::S32> out_a_counts,
                         ffi::ResultBuffer<ffi::F32> out_a_read,
                         ffi::ResultBuffer<ffi::S32> out_b_counts,
                         ffi::ResultBuffer<ffi::F32> out_b_read) {
  if (s.dimensions().size() != 2 || starts.element_count() != 3) {
    return ffi::Error::InvalidArgument("top_m ranks: s must be [R, G], starts [3]");
  }
  const int64_t rows = s.dimensions()[0], cols = s.dimensions()[1];
  if (auto e = CheckSide(a_value, a_target, a_code, a_counts, a_read, rows); e.failure()) {
    return e;
  }
  if (auto e = CheckSide(b_value, b_target, b_code, b_counts, b_read, cols); e.failure()) {
    return e;
  }
  const int32_t* st = starts.typed_data();
  CountTile t{};
  t.s = s.typed_data();
  t.rows = rows;
  t.cols = cols;
  // rows and columns are items of one set here: those at or above num_items are padding
  t.valid_rows = Clamp(static_cast<int64_t>(st[2]) - st[0], rows);
  t.valid_cols = Clamp(static_cast<int64_t>(st[2]) - st[1], cols);
  t.a_start = st[0];
  t.b_start = st[1];
  t.exclude_self = false;
  t.a = MakeSide(a_value, a_target, a_code, a_counts, a_read, out_a_counts, out_a_read);
  t.b = MakeSide(b_value, b_target, b_code, b_counts, b_read, out_b_counts, out_b_read);
  t.col_codes = b_code.typed_data();
  Count(t, vectorized != 0);
  return ffi::Error::Success();
}


// ------------------------------------------------------------------------ whole rows
// top_m._top_m_by_rows for large m: the m best items of each row of S [R, G] (whole rows of
// the similarity matrix), by (value descending, index ascending), masked items (self,
// padding) never returned. Per row: a threshold below the m-th best value guessed from an
// evenly spaced sample of the row, one pass keeping the items at or above it (about m of
// them; when fewer than m, all items are kept), the m-th best value among those by a
// selection (nth_element), then the items above it and, in index order, as many of those
// equal to it as fit, sorted. XLA:CPU's top_k sorts each row instead.

using Item = std::pair<float, int32_t>;

// The items of a row (masked ones left out) with value >= floor, in index order, from
// column c0 on.
void GatherScalar(const float* row, int64_t c0, int64_t valid_cols, int64_t self_col,
                  int32_t b_start, float floor, std::vector<Item>* out) {
  for (int64_t c = c0; c < valid_cols; ++c) {
    if (c == self_col) continue;
    const float x = Sanitize(row[c]);
    if (x >= floor) out->emplace_back(x, b_start + static_cast<int32_t>(c));
  }
}

#ifdef DML_JAX_X86
__attribute__((target("avx2"))) void GatherAvx2(const float* row, int64_t valid_cols,
                                                int64_t self_col, int32_t b_start, float floor,
                                                std::vector<Item>* out) {
  const __m256 lowest = _mm256_set1_ps(-FLT_MAX), highest = _mm256_set1_ps(FLT_MAX);
  const __m256 f = _mm256_set1_ps(floor);
  const int64_t full = valid_cols / 8 * 8;
  alignas(32) float x[8];
  for (int64_t c = 0; c < full; c += 8) {
    __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(row + c), lowest), highest);
    unsigned bits = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, f, _CMP_GE_OQ)));
    if (bits == 0) continue;
    _mm256_store_ps(x, v);
    for (; bits != 0; bits &= bits - 1) {
      const int lane = __builtin_ctz(bits);
      if (c + lane != self_col) out->emplace_back(x[lane], b_start + static_cast<int32_t>(c + lane));
    }
  }
  GatherScalar(row, full, valid_cols, self_col, b_start, floor, out);
}
#endif

void Gather(const float* row, int64_t valid_cols, int64_t self_col, int32_t b_start,
            float floor, std::vector<Item>* out) {
  out->clear();
#ifdef DML_JAX_X86
  if (__builtin_cpu_supports("avx2")) {
    GatherAvx2(row, valid_cols, self_col, b_start, floor, out);
    return;
  }
#endif
  GatherScalar(row, 0, valid_cols, self_col, b_start, floor, out);
}

// A value that about m + a margin of the n items reach, from a sample of the row.
float GuessFloor(const float* row, int64_t valid_cols, int64_t m, int64_t n,
                 std::vector<float>* sample) {
  const int64_t want = 1024;
  if (n <= 2 * want || 4 * m >= n) return -FLT_MAX;   // small rows: keep everything
  const int64_t stride = valid_cols / want;
  sample->clear();
  for (int64_t c = 0; c < valid_cols; c += stride) sample->push_back(Sanitize(row[c]));
  const double p = static_cast<double>(m) / static_cast<double>(n);
  const double expected = p * static_cast<double>(sample->size());
  // a rank past the expected one by 4 binomial standard deviations (and a few items)
  int64_t rank = static_cast<int64_t>(expected + 4.0 * std::sqrt(expected + 1.0) + 4.0);
  if (rank >= static_cast<int64_t>(sample->size())) return -FLT_MAX;
  std::nth_element(sample->begin(), sample->begin() + rank, sample->end(),
                   [](float x, float y) { return x > y; });
  return (*sample)[rank];
}

ffi::Error SelectRowsImpl(ffi::Buffer<ffi::F32> s, ffi::Buffer<ffi::S32> starts,
                          int32_t exclude_self, ffi::ResultBuffer<ffi::S32> out) {
  auto d = s.dimensions();
  auto o = out->dimensions();
  if (d.size() != 2 || starts.element_count() != 3 || o.size() != 2 || o[0] != d[0]) {
    return ffi::Error::InvalidArgument("top_m select: s must be [R, G], starts [3], out [R, m]");
  }
  const int64_t rows = d[0], cols = d[1], m = o[1];
  const int32_t* st = starts.typed_data();
  const int64_t valid_cols = Clamp(static_cast<int64_t>(st[2]) - st[1], cols);
  const int64_t self_offset = static_cast<int64_t>(st[0]) - st[1];
  std::vector<float> sample, values;
  std::vector<Item> items;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = s.typed_data() + r * cols;
    const int64_t self_col = exclude_self ? r + self_offset : -1;
    const bool self_in = self_col >= 0 && self_col < valid_cols;
    const int64_t n = valid_cols - (self_in ? 1 : 0);
    int32_t* idx = out->typed_data() + r * m;
    if (n < m) {   // fewer items than asked (a caller error): fill with -1
      for (int64_t j = 0; j < m; ++j) idx[j] = -1;
      continue;
    }
    Gather(row, valid_cols, self_col, st[1], GuessFloor(row, valid_cols, m, n, &sample),
           &items);
    if (static_cast<int64_t>(items.size()) < m) {   // the guess was too high: keep all
      Gather(row, valid_cols, self_col, st[1], -FLT_MAX, &items);
    }
    values.resize(items.size());
    for (size_t j = 0; j < items.size(); ++j) values[j] = items[j].first;
    std::nth_element(values.begin(), values.begin() + (m - 1), values.end(),
                     [](float x, float y) { return x > y; });
    const float thr = values[m - 1];
    int64_t above = 0;
    for (float v : values) above += v > thr;
    int64_t equal_left = m - above;
    // keep the items above thr and the first (lowest-index) ones equal to it, in order
    size_t kept = 0;
    for (const Item& it : items) {
      if (it.first > thr || (it.first == thr && equal_left-- > 0)) items[kept++] = it;
    }
    items.resize(kept);
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& a, const Item& b) { return a.first > b.first; });
    for (int64_t j = 0; j < m; ++j) idx[j] = items[j].second;
  }
  return ffi::Error::Success();
}


// ------------------------------------------------------------------------ row argmax
// k-means' assignment step (dml_jax.evaluation.kmeans.assign): the index of the largest value
// of each row of S [R, K] and that value, exactly as jnp.argmax and take_along_axis give them:
// the first index of the row's maximum (-0.0 and +0.0 compare equal), or the first NaN of a
// row that has one. One pass for the maximum, 8 values at a time, then one for its first
// index (the row is in the cache by then). XLA:CPU's argmax is a variadic reduction that it
// does not vectorise: it cost twice the [R, K] product it follows.

inline int64_t ArgmaxScalar(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t c = 0; c < n; ++c) {
    if (row[c] != row[c]) return c;   // NaN
    if (row[c] > row[best]) best = c;
  }
  return best;
}

#ifdef DML_JAX_X86
__attribute__((target("avx2"))) int64_t ArgmaxAvx2(const float* row, int64_t n) {
  const int64_t full = n / 8 * 8;
  if (full == 0) return ArgmaxScalar(row, n);
  __m256 top = _mm256_loadu_ps(row);
  __m256 nan = _mm256_cmp_ps(top, top, _CMP_UNORD_Q);
  for (int64_t c = 8; c < full; c += 8) {
    const __m256 v = _mm256_loadu_ps(row + c);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    top = _mm256_max_ps(top, v);
  }
  if (_mm256_movemask_ps(nan) != 0) return ArgmaxScalar(row, n);   // the first NaN
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  float m = lanes[0];
  for (int i = 1; i < 8; ++i) m = lanes[i] > m ? lanes[i] : m;
  for (int64_t c = full; c < n; ++c) {
    if (row[c] != row[c]) return c;   // no NaN before the tail: the tail's first is the row's
    m = row[c] > m ? row[c] : m;
  }
  const __m256 target = _mm256_set1_ps(m);
  for (int64_t c = 0; c < full; c += 8) {
    const int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + c), target,
                                                      _CMP_EQ_OQ));
    if (bits != 0) return c + __builtin_ctz(static_cast<unsigned>(bits));
  }
  for (int64_t c = full; c < n; ++c) {
    if (row[c] == m) return c;
  }
  return 0;   // not reached: m is a value of the row
}
#endif

ffi::Error ArgmaxRowsImpl(ffi::Buffer<ffi::F32> s, int32_t vectorized,
                          ffi::ResultBuffer<ffi::S32> index, ffi::ResultBuffer<ffi::F32> value) {
  auto d = s.dimensions();
  if (d.size() != 2 || d[1] < 1 || index->element_count() != d[0] ||
      value->element_count() != d[0]) {
    return ffi::Error::InvalidArgument("top_m argmax: s must be [R, K] with K >= 1, "
                                       "index and value [R]");
  }
  const int64_t rows = d[0], cols = d[1];
  bool avx2 = false;
#ifdef DML_JAX_X86
  avx2 = vectorized != 0 && __builtin_cpu_supports("avx2");
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = s.typed_data() + r * cols;
    int64_t best;
#ifdef DML_JAX_X86
    best = avx2 ? ArgmaxAvx2(row, cols) : ArgmaxScalar(row, cols);
#else
    best = ArgmaxScalar(row, cols);
#endif
    index->typed_data()[r] = static_cast<int32_t>(best);
    value->typed_data()[r] = row[best];
  }
  return ffi::Error::Success();
}

}  // namespace

// s [R, G], best (values, indices) [R, m], starts int32 [3] = (a_start, b_start, num_items);
// attributes exclude_self and vectorized (0 or 1).
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxTopMMergeRows, MergeRowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<int32_t>("exclude_self")
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

// s [R, G], best of the rows [R, m], best of the columns [G, m], starts and vectorized as
// above (no self pairs: the blocks differ).
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxTopMMergeBoth, MergeBothImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

// s [R, G], starts as above, the rows' (value [R], target [R], code [R]), the columns' codes
// [G], the rows' (counts [R, 3], read [R]); attributes exclude_self and vectorized.
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxTopMCountRows, CountRowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("exclude_self")
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// s [R, G], starts, then (value, target, code, counts, read) of the rows and of the columns
// (the columns' codes are the column items' codes; no self pairs: the blocks differ).
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxTopMCountBoth, CountBothImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// s [R, G] (whole rows), starts int32 [3] = (first row's index, first column's index, number
// of items); attribute exclude_self; out int32 [R, m].
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxTopMSelectRows, SelectRowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<int32_t>("exclude_self")
                                  .Ret<ffi::Buffer<ffi::S32>>());

// s [R, K]; attribute vectorized (0 or 1); out (index int32 [R], value float32 [R]).
XLA_FFI_DEFINE_HANDLER_SYMBOL(DmlJaxTopMArgmaxRows, ArgmaxRowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("vectorized")
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
