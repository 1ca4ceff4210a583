// y[n, N] = x[n, K] . W[N, K]^T for bfloat16 x and W, float32 accumulation, n rows of x: up to 11 in one
// pass over W, more 8 at a time (16 at a time with AMX tiles, where N is a multiple of 16: linear_amx.cpp).
//
// Decoding multiplies a few activation rows by every weight matrix, so it is bound by reading W.
// This kernel streams each row of W once, multiplies it into all n activation rows with AVX512-BF16
// dot products (_mm512_dpbf16_ps) and splits the rows of W over torch's intra-op threads.
#include "kernels.h"  // what this file defines, declared as its callers see it
#include <immintrin.h>

#include "amx.h"
#include "linear_common.h"

namespace triforce_linear {
template <typename Out>
void run_amx(const at::Tensor& x, const at::Tensor& w, at::Tensor& y);
}  // namespace triforce_linear

namespace {

template <int N_ROWS, typename Out>
void linear_rows(const at::BFloat16* x, const at::BFloat16* w, Out* y, int64_t K, int64_t N,
                 int64_t begin, int64_t end, triforce_linear::RowAhead ahead) {
  const int64_t steps = K / 32;
  for (int64_t r = begin; r < end; ++r) {
    triforce_linear::prefetch_row_ahead(w, r, K, ahead);
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
    for (int t = 0; t < N_ROWS; ++t) y[t * N + r] = Out(_mm512_reduce_add_ps(acc[t]));
  }
}

constexpr int kPassRows = triforce_linear::kAvx512PassRows;

template <typename Out>
constexpr triforce_linear::RowsFn<at::BFloat16, at::BFloat16, Out> kRows[kPassRows] = {
    linear_rows<1, Out>, linear_rows<2, Out>, linear_rows<3, Out>,  linear_rows<4, Out>,
    linear_rows<5, Out>, linear_rows<6, Out>, linear_rows<7, Out>,  linear_rows<8, Out>,
    linear_rows<9, Out>, linear_rows<10, Out>, linear_rows<11, Out>};

template <typename Out>
void run(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  const int64_t K = x.size(1), N = w.size(0);
  triforce_linear::parallel_rows<kPassRows>(kRows<Out>, static_cast<int>(x.size(0)), x.data_ptr<at::BFloat16>(),
                                            w.data_ptr<at::BFloat16>(), y.data_ptr<Out>(), K, N);
}

}  // namespace

// float_out: float32 y, unrounded (logits: bfloat16's 8-bit mantissa would tie near-equal candidates).
at::Tensor linear_bf16(at::Tensor x, at::Tensor w, bool float_out, bool allow_amx) {
  const bool amx = allow_amx && triforce_amx::usable() && w.size(0) % 16 == 0;
  auto y = triforce_linear::checked_output(x, w, float_out);
#if TRIFORCE_WITH_AMX
  if (amx && float_out) triforce_linear::run_amx<float>(x, w, y);
  else if (amx) triforce_linear::run_amx<at::BFloat16>(x, w, y);
  else
#endif
  if (float_out) run<float>(x, w, y);
  else run<at::BFloat16>(x, w, y);
  return y;
}
