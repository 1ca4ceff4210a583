// The AVX2 + FMA decode-linear row functions, for bfloat16 weights (widened to float32 in registers: the
// `avx2` build's linear_bf16, linear_avx2.cpp) and float32 weights (linear_f32.cpp, every build): float32
// rows of x times W's rows with float32 FMA, W read once for any count of rows of x. Included by one
// source of each build.
#pragma once
#include "aten.h"
#include <immintrin.h>

#include "linear_common.h"
#include "vec256.h"

namespace triforce_linear_avx2 {


using triforce_vec256::hsum;
using triforce_vec256::to_ps;

// One row of W against ROWS <= 4 float32 rows of x (xf: [ROWS, K], K a multiple of 16) into y[t * N],
// two accumulator chains per row to hide the FMA latency. The sums run in the same order for every ROWS,
// so up to 4 rows a row's result does not depend on how many rows share the pass.
template <int ROWS, typename W, typename Out>
inline void row_times_x(const float* xf, const W* wrow, Out* y, int64_t K, int64_t N) {
  __m256 acc0[ROWS], acc1[ROWS];
  for (int t = 0; t < ROWS; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __m256 w0 = to_ps(wrow + k), w1 = to_ps(wrow + k + 8);
    for (int t = 0; t < ROWS; ++t) {
      acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xf + t * K + k), acc0[t]);
      acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xf + t * K + k + 8), acc1[t]);
    }
  }
  for (int t = 0; t < ROWS; ++t) y[t * N] = Out(hsum(_mm256_add_ps(acc0[t], acc1[t])));
}

// W_ROWS rows of W (w: the first) against X_ROWS <= 4 float32 rows of x (xf: [X_ROWS, K], K a multiple of
// 8) into y[t * N + i]: one accumulator per (row of W, row of x), summed over k in steps of 8, added
// across its lanes at the end (the same order however the rows of W are blocked). 3 x 4 accumulators,
// 3 widened rows of W and one of x fill the 16 vector registers: each load of x feeds three FMAs and each
// widened row of W four, where row_times_x loads x for every FMA. Where the FMAs bound the pass (5 or
// more rows of x), that took a microbenchmark (1,536-1,560 x 576 in cache, one core of the AVX2 EPYC)
// from 44-48 to 63-79 GFLOP/s; where memory does (1 to 4 rows), its three streams of W read slower
// than row_times_x's one (benchmarks/linear_bandwidth.py: 16.9 against 23.3 GB/s at 1 row).
template <int W_ROWS, int X_ROWS, typename W, typename Out>
inline void block_times_x(const float* xf, const W* w, Out* y, int64_t K, int64_t N) {
  __m256 acc[W_ROWS][X_ROWS];
  for (int i = 0; i < W_ROWS; ++i)
    for (int t = 0; t < X_ROWS; ++t) acc[i][t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 wv[W_ROWS];
    for (int i = 0; i < W_ROWS; ++i) wv[i] = to_ps(w + i * K + k);
    for (int t = 0; t < X_ROWS; ++t) {
      const __m256 xv = _mm256_loadu_ps(xf + t * K + k);
      for (int i = 0; i < W_ROWS; ++i) acc[i][t] = _mm256_fmadd_ps(wv[i], xv, acc[i][t]);
    }
  }
  for (int i = 0; i < W_ROWS; ++i)
    for (int t = 0; t < X_ROWS; ++t) y[t * N + i] = Out(hsum(acc[i][t]));
}

// W_ROWS rows of W against all 5 <= N_ROWS <= 8 rows of x: 4, then the rest (the accumulators).
template <int W_ROWS, int N_ROWS, typename W, typename Out>
inline void block_times_all_x(const float* xf, const W* w, Out* y, int64_t K, int64_t N) {
  static_assert(N_ROWS > 4 && N_ROWS <= 8);
  block_times_x<W_ROWS, 4>(xf, w, y, K, N);
  block_times_x<W_ROWS, N_ROWS - 4>(xf + 4 * K, w, y + 4 * N, K, N);
}

// Rows [begin, end) of W against N_ROWS float32 rows of x: up to 4 rows, one row of W at a time
// (row_times_x); 5 to 8 (the FMAs' regime), three at a time, the last one or two alone. So a row's sums
// run in one order for every count of rows up to 4 and in another from 5 on.
template <int N_ROWS, typename W, typename Out>
void linear_rows(const float* xf, const W* w, Out* y, int64_t K, int64_t N, int64_t begin, int64_t end) {
  if constexpr (N_ROWS <= 4) {
    for (int64_t r = begin; r < end; ++r) {
      triforce_linear::prefetch_row_ahead(w, r, K, end);
      row_times_x<N_ROWS>(xf, w + r * K, y + r, K, N);
    }
  } else {
    constexpr int kBlock = 3;
    int64_t r = begin;
    for (; r + kBlock <= end; r += kBlock) {
      for (int i = 0; i < kBlock; ++i) triforce_linear::prefetch_row_ahead(w, r + i, K, end);
      block_times_all_x<kBlock, N_ROWS>(xf, w + r * K, y + r, K, N);
    }
    for (; r < end; ++r) {
      triforce_linear::prefetch_row_ahead(w, r, K, end);
      block_times_all_x<1, N_ROWS>(xf, w + r * K, y + r, K, N);
    }
  }
}

template <typename W, typename Out>
constexpr triforce_linear::RowsFn<float, W, Out> kRows[triforce_linear::kPieceRows] = {
    linear_rows<1, W, Out>, linear_rows<2, W, Out>, linear_rows<3, W, Out>, linear_rows<4, W, Out>,
    linear_rows<5, W, Out>, linear_rows<6, W, Out>, linear_rows<7, W, Out>, linear_rows<8, W, Out>};

// y[n, N] = xf[n, K] . W[N, K]^T, float32 rows of x against W's rows split over torch's threads.
template <typename W, typename Out>
void run(const float* xf, int n, const W* w, Out* y, int64_t K, int64_t N) {
  triforce_linear::parallel_rows(kRows<W, Out>, n, xf, w, y, K, N);
}

}  // namespace triforce_linear_avx2
