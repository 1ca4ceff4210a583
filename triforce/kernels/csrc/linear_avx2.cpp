// y[n, N] = x[n, K] . W[N, K]^T for bfloat16 x and W on AVX2 + FMA CPUs (no AVX512-BF16), n rows of x,
// 8 at a time.
//
// The `avx2` build's linear_bf16 (kernels/cpu.py). Weights stay bfloat16 in memory, half the bytes of
// float32, which is what a memory-bound decode step pays for; each row of W is widened to float32 in
// registers (a bfloat16 is the top half of a float32: shift left by 16) and multiplied into all n
// activation rows, which were widened once, with FMA. Float32 accumulation, rounded once, like
// reference_linear; rows of W are split over torch's intra-op threads.
#include "kernels.h"  // what this file defines, declared as its callers see it
#include <immintrin.h>

#include <vector>

#include "linear_common.h"
#include "vec256.h"

namespace {

using triforce_vec256::bf16_to_ps;
using triforce_vec256::hsum;

// One row of W against ROWS <= 4 float32 rows of x (xf: [ROWS, K], K a multiple of 16) into y[t * N],
// two accumulator chains per row to hide the FMA latency. The sums run in the same order for every ROWS,
// so a row's result does not depend on how many rows share the pass.
template <int ROWS, typename Out>
inline void row_times_x(const float* xf, const at::BFloat16* wrow, Out* y, int64_t K, int64_t N) {
  __m256 acc0[ROWS], acc1[ROWS];
  for (int t = 0; t < ROWS; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __m256 w0 = bf16_to_ps(wrow + k), w1 = bf16_to_ps(wrow + k + 8);
    for (int t = 0; t < ROWS; ++t) {
      acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xf + t * K + k), acc0[t]);
      acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xf + t * K + k + 8), acc1[t]);
    }
  }
  for (int t = 0; t < ROWS; ++t) y[t * N] = Out(hsum(_mm256_add_ps(acc0[t], acc1[t])));
}

// Rows [begin, end) of W against N_ROWS float32 rows of x, at most 4 at a time: two chains for each of
// 8 rows would not fit the 16 vector registers (they spilled, and 8 rows read W at 9 GB/s, 4 at 12; in
// two passes over each row of W, 8 rows read it at 11-14 GB/s, benchmarks/linear_bandwidth.py).
template <int N_ROWS, typename Out>
void linear_rows(const float* xf, const at::BFloat16* w, Out* y, int64_t K, int64_t N, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    triforce_linear::prefetch_row_ahead(w, r, K, end);
    if constexpr (N_ROWS <= 4) {
      row_times_x<N_ROWS>(xf, w + r * K, y + r, K, N);
    } else {
      row_times_x<4>(xf, w + r * K, y + r, K, N);
      row_times_x<N_ROWS - 4>(xf + 4 * K, w + r * K, y + 4 * N + r, K, N);
    }
  }
}

template <typename Out>
constexpr triforce_linear::RowsFn<float, Out> kRows[triforce_linear::kPieceRows] = {
    linear_rows<1, Out>, linear_rows<2, Out>, linear_rows<3, Out>, linear_rows<4, Out>,
    linear_rows<5, Out>, linear_rows<6, Out>, linear_rows<7, Out>, linear_rows<8, Out>};

template <typename Out>
void run(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  const int64_t K = x.size(1), N = w.size(0);
  // The few activation rows, widened once here (a torch op would cost its dispatch on every call).
  std::vector<float> xf(static_cast<size_t>(x.numel()));
  const auto* xp = x.data_ptr<at::BFloat16>();
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = static_cast<float>(xp[i]);
  triforce_linear::parallel_rows(kRows<Out>, static_cast<int>(x.size(0)), static_cast<const float*>(xf.data()),
                                 w.data_ptr<at::BFloat16>(), y.data_ptr<Out>(), K, N);
}

}  // namespace

// float_out: float32 y, unrounded (logits). allow_amx: ignored (no tiles at this level).
at::Tensor linear_bf16(at::Tensor x, at::Tensor w, bool float_out, bool /*allow_amx*/) {
  auto y = triforce_linear::checked_output(x, w, float_out);
  if (float_out) run<float>(x, w, y);
  else run<at::BFloat16>(x, w, y);
  return y;
}
