// What the decode-linear kernels of every level share (linear_bf16.cpp for AVX512-BF16 and AMX,
// linear_avx2.cpp for AVX2, linear_f32.cpp for float32 weights): the argument checks of linear_bf16 and
// the split of W's rows over torch's intra-op threads. A level supplies row functions: rows [begin, end)
// of W against 1..kPieceRows rows of x. More rows of x than that go in pieces over one tile of W rows at a
// time, so W still comes from memory once and the later pieces read it from the core's cache.
#pragma once
#include "aten.h"

#include <xmmintrin.h>

#include <algorithm>

namespace triforce_linear {

constexpr int kPieceRows = 8;  // rows of x one pass of a vector row function takes (its accumulators)
// Rows of x one pass of the AVX512-BF16 row functions takes (linear_bf16.cpp, linear_i8.cpp; more go in
// pieces of kPieceRows): a pass of 9 to 11 rows still hides its dot products behind memory, where pieces of
// 8 and the rest did not. SmolLM2's layer matrices (212 MB) took 0.84x, 0.89x and 0.95x the time at 9, 10
// and 11 rows (int8 weights 0.81x, 0.87x, 0.90x) and 1.03x at 12 on the 2-core Zen 4 (`python
// benchmarks/kernel_ab.py --kernel linear --new 1 9 10 11 12 --base ca1f92d`, and `--dtype int8`); from 12
// rows a pass waits on its dot products, and at 16 one pass ran 1.3x the pieces. The AVX2 path (16 vector
// registers, x in pairs) ran 1.04-1.07x slower so, and keeps kPieceRows.
constexpr int kAvx512PassRows = 11;
constexpr int64_t kTileBytes = 64 * 1024;  // W rows per tile: what the later pieces re-read from L2

// Which row of W a row function asks for before it uses row r: row r + rows, unless that is at or past
// `limit` (rows 0: none). See parallel_rows.
struct RowAhead {
  int64_t rows, limit;
};

template <typename X, typename W, typename Out>
using RowsFn = void (*)(const X* x, const W* w, Out* y, int64_t K, int64_t N, int64_t begin, int64_t end,
                        RowAhead ahead);

// Asks for row r + ahead.rows of W (rows of K elements) into L2: the vector row functions call it before
// each row, and their read rate rose from 16-17 to 22-26 GB/s at 1 row of x and from 12 to 18-24 GB/s at 4
// (AVX2), 13-14 to 17-19 GB/s at 4 (AVX512-BF16), on the AMX Xeon, with the row 8 KB ahead: the hardware
// prefetcher alone left the FMA work waiting on memory. Into L1 it would push out the rows of x. (The AMX
// tile path, which reads 16 rows of W at a time, ran 5-15% slower with it, and prefetches its next block
// of 16 rows its own way: linear_amx.cpp.)
template <typename W>
inline void prefetch_row_ahead(const W* w, int64_t r, int64_t K, RowAhead ahead) {
  const int64_t row = r + ahead.rows;
  if (ahead.rows == 0 || row >= ahead.limit) return;
  const char* next = reinterpret_cast<const char*>(w + row * K);
  for (int64_t b = 0; b < K * static_cast<int64_t>(sizeof(W)); b += 64) _mm_prefetch(next + b, _MM_HINT_T1);
}

// y[n, N] = x[n, K] . W^T with rows[i] the row function for i + 1 rows of x (PassRows of them, at least
// kPieceRows). Rows of W over the threads, at least ~256 KB of W per task, so small matrices are not split
// into tiny pieces. Up to PassRows rows of x go in one pass over W. More go in pieces of kPieceRows over a
// tile of W at a time: the first piece reads the tile from memory, asking for
// each row 8 KB ahead (4 KB gained less, 16 and 32 KB no more; near the tile's end, rows of the next,
// which the second asks for again); the second reads it from L2 and asks for
// the next tile's rows, one for each of its own, so that memory keeps streaming while the later pieces
// compute; the rest ask for none. A level whose row functions for 9 to 11 rows cost their memory time passes
// them whole (kAvx512PassRows): in pieces, 9 rows were 8 and 1, and the short second piece left memory idle
// while the first computed on the next tile.
template <int PassRows = kPieceRows, typename X, typename W, typename Out>
void parallel_rows(const RowsFn<X, W, Out>* rows, int n, const X* x, const W* w, Out* y, int64_t K, int64_t N) {
  static_assert(PassRows >= kPieceRows);
  constexpr int64_t kAheadBytes = 8192;
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(W));
  const int64_t grain = std::max<int64_t>(1, (256 * 1024) / row_bytes);
  const int piece = n <= PassRows ? n : kPieceRows;
  const int64_t tile = n <= PassRows ? N : std::max<int64_t>(1, kTileBytes / row_bytes);
  const int64_t near = (kAheadBytes + row_bytes - 1) / row_bytes;
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t0 = begin; t0 < end; t0 += tile)
      for (int r0 = 0; r0 < n; r0 += piece) {
        const RowAhead ahead = r0 == 0 ? RowAhead{near, end} : r0 == piece ? RowAhead{tile, end} : RowAhead{0, 0};
        rows[std::min(piece, n - r0) - 1](x + r0 * K, w, y + r0 * N, K, N, t0, std::min(end, t0 + tile), ahead);
      }
  });
}

// Checks a decode linear's arguments (x [n, K] with n >= 1, W [N, K] contiguous, both of `type`, K a
// multiple of `k_step`: 32 for linear_bf16, 16 for linear_f32); makes x contiguous; returns y [n, N],
// float32 (unrounded: logits) or of `type`.
inline at::Tensor checked_output(at::Tensor& x, const at::Tensor& w, bool float_out,
                                 at::ScalarType type = at::kBFloat16, int64_t k_step = 32) {
  TORCH_CHECK(x.scalar_type() == type && w.scalar_type() == type,
              type == at::kFloat ? "float32 only" : "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [n, K], w [N, K]");
  TORCH_CHECK(x.size(1) > 0 && x.size(1) % k_step == 0, "K must be a positive multiple of ", k_step);
  TORCH_CHECK(w.is_contiguous(), "w must be contiguous");
  TORCH_CHECK(x.size(0) >= 1, "at least one row of x");
  x = x.contiguous();
  return at::empty({x.size(0), w.size(0)}, x.options().dtype(float_out ? at::kFloat : type));
}

}  // namespace triforce_linear
