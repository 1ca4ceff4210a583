// y[n, N] = x[n, K] . W[N, K]^T for bfloat16 x and W on AVX2 + FMA CPUs (no AVX512-BF16), n <= 8 rows.
//
// The `avx2` build's linear_bf16 (kernels/cpu.py). Weights stay bfloat16 in memory, half the bytes of
// float32, which is what a memory-bound decode step pays for; each row of W is widened to float32 in
// registers (a bfloat16 is the top half of a float32: shift left by 16) and multiplied into all n
// activation rows, which were widened once, with FMA. Float32 accumulation, rounded once, like
// reference_linear; rows of W are split over torch's intra-op threads.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <vector>

#include "vec256.h"

namespace {

using triforce_vec256::bf16_to_ps;
using triforce_vec256::hsum;

// Rows [begin, end) of W against N_ROWS float32 rows of x (xf: [N_ROWS, K]); K a multiple of 16.
template <int N_ROWS, typename Out>
void linear_rows(const float* xf, const at::BFloat16* w, Out* y, int64_t K, int64_t N, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const at::BFloat16* wrow = w + r * K;
    __m256 acc0[N_ROWS], acc1[N_ROWS];  // two chains per row hide the FMA latency
    for (int t = 0; t < N_ROWS; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __m256 w0 = bf16_to_ps(wrow + k), w1 = bf16_to_ps(wrow + k + 8);
      for (int t = 0; t < N_ROWS; ++t) {
        acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xf + t * K + k), acc0[t]);
        acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xf + t * K + k + 8), acc1[t]);
      }
    }
    for (int t = 0; t < N_ROWS; ++t) y[t * N + r] = Out(hsum(_mm256_add_ps(acc0[t], acc1[t])));
  }
}

template <typename Out>
using RowsFn = void (*)(const float*, const at::BFloat16*, Out*, int64_t, int64_t, int64_t, int64_t);
template <typename Out>
constexpr RowsFn<Out> kRows[8] = {linear_rows<1, Out>, linear_rows<2, Out>, linear_rows<3, Out>, linear_rows<4, Out>,
                                  linear_rows<5, Out>, linear_rows<6, Out>, linear_rows<7, Out>, linear_rows<8, Out>};

template <typename Out>
void run(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y) {
  const int64_t n = x.size(0), K = x.size(1), N = w.size(0);
  const std::vector<float> xf = [&] {
    std::vector<float> v(static_cast<size_t>(n * K));
    const auto* xp = x.data_ptr<at::BFloat16>();
    for (int64_t i = 0; i < n * K; ++i) v[i] = static_cast<float>(xp[i]);
    return v;
  }();
  const RowsFn<Out> rows = kRows<Out>[n - 1];
  const auto* wp = w.data_ptr<at::BFloat16>();
  auto* yp = y.data_ptr<Out>();
  // Grain: at least ~256 KB of W per task, so small matrices are not split into tiny pieces.
  const int64_t grain = std::max<int64_t>(1, (256 * 1024) / (K * 2));
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) { rows(xf.data(), wp, yp, K, N, begin, end); });
}

}  // namespace

// float_out: float32 y, unrounded (logits). allow_amx: ignored (no tiles at this level).
torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w, bool float_out, bool /*allow_amx*/) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [n, K], w [N, K]");
  TORCH_CHECK(x.size(1) % 32 == 0, "K must be a multiple of 32");
  TORCH_CHECK(w.is_contiguous(), "w must be contiguous");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= 8, "1 to 8 rows of x");
  x = x.contiguous();
  auto y = torch::empty({x.size(0), w.size(0)}, x.options().dtype(float_out ? at::kFloat : at::kBFloat16));
  if (float_out) run<float>(x, w, y);
  else run<at::BFloat16>(x, w, y);
  return y;
}
