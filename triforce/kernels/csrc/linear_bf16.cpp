// y[n, N] = x[n, K] . W[N, K]^T for bfloat16 x and W, float32 accumulation, n <= 8 rows of x.
//
// Decoding multiplies a few activation rows by every weight matrix, so it is bound by reading W.
// This kernel streams each row of W once, multiplies it into all n activation rows with AVX512-BF16
// dot products (_mm512_dpbf16_ps) and splits the rows of W over torch's intra-op threads.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

template <int N_ROWS>
void linear_rows(const at::BFloat16* x, const at::BFloat16* w, at::BFloat16* y, int64_t K, int64_t N,
                 int64_t begin, int64_t end) {
  const int64_t steps = K / 32;
  for (int64_t r = begin; r < end; ++r) {
    const __m512bh* wrow = reinterpret_cast<const __m512bh*>(w + r * K);
    __m512 acc[N_ROWS];
    for (int t = 0; t < N_ROWS; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t s = 0; s < steps; ++s) {
      const __m512bh wv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wrow + s));
      for (int t = 0; t < N_ROWS; ++t) {
        const __m512bh xv = reinterpret_cast<__m512bh>(
            _mm512_loadu_si512(reinterpret_cast<const __m512i*>(x + t * K) + s));
        acc[t] = _mm512_dpbf16_ps(acc[t], wv, xv);
      }
    }
    for (int t = 0; t < N_ROWS; ++t) y[t * N + r] = at::BFloat16(_mm512_reduce_add_ps(acc[t]));
  }
}

using RowsFn = void (*)(const at::BFloat16*, const at::BFloat16*, at::BFloat16*, int64_t, int64_t, int64_t,
                        int64_t);
constexpr RowsFn kRows[8] = {linear_rows<1>, linear_rows<2>, linear_rows<3>, linear_rows<4>,
                             linear_rows<5>, linear_rows<6>, linear_rows<7>, linear_rows<8>};

}  // namespace

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [n, K], w [N, K]");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= 8, "1 to 8 rows of x");
  TORCH_CHECK(x.size(1) % 32 == 0, "K must be a multiple of 32");
  TORCH_CHECK(w.is_contiguous(), "w must be contiguous");
  x = x.contiguous();
  const int64_t n = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({n, N}, x.options());
  const RowsFn rows = kRows[n - 1];
  const auto* xp = x.data_ptr<at::BFloat16>();
  const auto* wp = w.data_ptr<at::BFloat16>();
  auto* yp = y.data_ptr<at::BFloat16>();
  // Grain: at least ~256 KB of W per task, so small matrices are not split into tiny pieces.
  const int64_t grain = std::max<int64_t>(1, (256 * 1024) / (K * 2));
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) { rows(xp, wp, yp, K, N, begin, end); });
  return y;
}
