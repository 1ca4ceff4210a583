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

// W_ROWS rows of W (w: the first) against X_ROWS float32 rows of x (xf: [X_ROWS, K], K a multiple of 16)
// into y[t * N + i]. Each (row of W, row of x) sums in one order, whatever W_ROWS and X_ROWS: two
// accumulator chains (the first and the second 8 lanes of every 16 k, two chains hide the FMA latency),
// added lane-wise, then across lanes. So a row of x gets the same numbers whatever rows share its pass,
// and a check of n tokens gives each token what a one-token step gives it, bit for bit (until
// 2026-11-30 the blocks of 5 or more rows ran one chain, and a token's logits moved by up to 0.55 in
// bfloat16 with the rows beside it at 100 keys, where attention split alike: `python
// benchmarks/check_rows.py`).
template <int W_ROWS, int X_ROWS, typename W, typename Out>
inline void block_times_x(const float* xf, const W* w, Out* y, int64_t K, int64_t N) {
  __m256 acc[2][W_ROWS][X_ROWS];
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < W_ROWS; ++i)
      for (int t = 0; t < X_ROWS; ++t) acc[h][i][t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 16)
    for (int h = 0; h < 2; ++h) {
      __m256 wv[W_ROWS];
      for (int i = 0; i < W_ROWS; ++i) wv[i] = to_ps(w + i * K + k + 8 * h);
      for (int t = 0; t < X_ROWS; ++t) {
        const __m256 xv = _mm256_loadu_ps(xf + t * K + k + 8 * h);
        for (int i = 0; i < W_ROWS; ++i) acc[h][i][t] = _mm256_fmadd_ps(wv[i], xv, acc[h][i][t]);
      }
    }
  for (int i = 0; i < W_ROWS; ++i)
    for (int t = 0; t < X_ROWS; ++t) y[t * N + i] = Out(hsum(_mm256_add_ps(acc[0][i][t], acc[1][i][t])));
}

// block_times_x's sums, in the same order bit for bit, with its two chains run one after the other: first
// every k whose k % 16 < 8, then the rest, each over W_ROWS x X_ROWS accumulators, the first chain's sums
// kept aside for the second's. With half the accumulators live, a pass takes 4 rows of x where
// block_times_x takes 2, and each widened row of W feeds four FMAs instead of two.
template <int W_ROWS, int X_ROWS, typename W, typename Out>
inline void block_times_x_chains_apart(const float* xf, const W* w, Out* y, int64_t K, int64_t N) {
  __m256 first[W_ROWS][X_ROWS];
  for (int h = 0; h < 2; ++h) {
    __m256 acc[W_ROWS][X_ROWS];
    for (int i = 0; i < W_ROWS; ++i)
      for (int t = 0; t < X_ROWS; ++t) acc[i][t] = _mm256_setzero_ps();
    for (int64_t k = 8 * h; k < K; k += 16) {
      __m256 wv[W_ROWS];
      for (int i = 0; i < W_ROWS; ++i) wv[i] = to_ps(w + i * K + k);
      for (int t = 0; t < X_ROWS; ++t) {
        const __m256 xv = _mm256_loadu_ps(xf + t * K + k);
        for (int i = 0; i < W_ROWS; ++i) acc[i][t] = _mm256_fmadd_ps(wv[i], xv, acc[i][t]);
      }
    }
    for (int i = 0; i < W_ROWS; ++i)
      for (int t = 0; t < X_ROWS; ++t) first[i][t] = h == 0 ? acc[i][t] : _mm256_add_ps(first[i][t], acc[i][t]);
  }
  for (int i = 0; i < W_ROWS; ++i)
    for (int t = 0; t < X_ROWS; ++t) y[t * N + i] = Out(hsum(first[i][t]));
}

// W_ROWS rows of W against all 5 <= N_ROWS <= 8 rows of x: four at a time with the chains apart (3 rows of
// W x 4 rows of x = 12 accumulators; with 3 widened rows of W and one of x they fill the 16 vector
// registers), the last three likewise, the last one or two with the chains together (block_times_x).
// Where the FMAs bound the pass (5 or more rows of x) each load of x feeds three FMAs and each widened row
// of W four, where one row of W at a time loads x for every FMA; where memory does (1 to 4 rows), three
// streams of W read slower than one (benchmarks/linear_bandwidth.py: 16.9 against 23.3 GB/s at 1 row, the
// AVX2 EPYC). W's three rows are read again for each group of x rows: from L1 while they fit beside the
// rows of x (SmolLM2's K of 576 and 1,536); a K of 8,960 (a 7B model's down projection) reads them from
// L2 (not measured).
template <int W_ROWS, int N_ROWS, typename W, typename Out>
inline void block_times_all_x(const float* xf, const W* w, Out* y, int64_t K, int64_t N) {
  static_assert(N_ROWS > 4 && N_ROWS <= 8);
  block_times_x_chains_apart<W_ROWS, 4>(xf, w, y, K, N);
  constexpr int kLeft = N_ROWS - 4;
  if constexpr (kLeft >= 3) block_times_x_chains_apart<W_ROWS, kLeft>(xf + 4 * K, w, y + 4 * N, K, N);
  else block_times_x<W_ROWS, kLeft>(xf + 4 * K, w, y + 4 * N, K, N);
}

// Rows [begin, end) of W against N_ROWS float32 rows of x: up to 4 rows, one row of W at a time; 5 to 8
// (the FMAs' regime), three at a time, the last one or two alone.
template <int N_ROWS, typename W, typename Out>
void linear_rows(const float* xf, const W* w, Out* y, int64_t K, int64_t N, int64_t begin, int64_t end,
                 triforce_linear::RowAhead ahead) {
  if constexpr (N_ROWS <= 4) {
    for (int64_t r = begin; r < end; ++r) {
      triforce_linear::prefetch_row_ahead(w, r, K, ahead);
      block_times_x<1, N_ROWS>(xf, w + r * K, y + r, K, N);
    }
  } else {
    constexpr int kBlock = 3;
    int64_t r = begin;
    for (; r + kBlock <= end; r += kBlock) {
      for (int i = 0; i < kBlock; ++i) triforce_linear::prefetch_row_ahead(w, r + i, K, ahead);
      block_times_all_x<kBlock, N_ROWS>(xf, w + r * K, y + r, K, N);
    }
    for (; r < end; ++r) {
      triforce_linear::prefetch_row_ahead(w, r, K, ahead);
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
