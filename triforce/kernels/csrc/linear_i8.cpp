// y[n, N] = (x[n, K] . Q[N, K]^T) * scale[N] for bfloat16 or float32 x and int8 weights Q with one float32
// scale per row of Q (symmetric, per output channel: models/quantized.py), in every build.
//
// The weights of a proposing tier (--retrieval-weights int8: the retrieval tier's copy of the target;
// --draft-weights int8: the draft's) are read in a quarter of float32's bytes and half of bfloat16's, which
// is what a memory-bound decode step pays for. Q's rows are widened to float32 in registers (exact:
// |q| <= 127) and multiplied into the activation rows, widened once, with the float32 FMA row functions of
// linear_avx2.h (W read once for any count of rows of x, a row's sums in one order whatever the count);
// each sum is then scaled by its row's scale and rounded once. With AVX512-BF16, bfloat16 rows of x instead
// meet Q's rows converted to bfloat16 (exact too) in bfloat16 dot products, as linear_bf16.cpp's: a first
// version with the float32 FMAs alone ran slower than the bfloat16 kernel from 4 rows of x on the Zen 4
// (a scratch copy of `python benchmarks/int8_linear.py`, which measures this one). With AMX tiles (N a
// multiple of 16), 16 rows of Q at a time are widened to bfloat16 into an A tile and multiplied as
// linear_amx.cpp multiplies bfloat16 weights: the vector path's dot products per row of x made a check of
// 8 tokens cost 2.5x a step on the AMX Xeon.
#include "kernels.h"  // what this file defines, declared as its callers see it

#include <type_traits>
#include <vector>

#include "amx.h"
#include "linear_avx2.h"
#include "vec256.h"
#if defined(__AVX512BF16__)
#include "vec512.h"
#endif

namespace triforce_linear {
void run_amx_i8(const at::Tensor& x, const at::Tensor& q, at::Tensor& y);
}  // namespace triforce_linear

namespace {

#if defined(__AVX512BF16__)
using triforce_vec::int8_to_bf16;

// Rows [begin, end) of Q against N_ROWS bfloat16 rows of x (K a multiple of 32), unscaled float32 sums; each
// row of x sums in one order whatever N_ROWS is.
template <int N_ROWS>
void bf16_rows(const at::BFloat16* x, const int8_t* q, float* y, int64_t K, int64_t N, int64_t begin, int64_t end,
               triforce_linear::RowAhead ahead) {
  const int64_t steps = K / 32;
  for (int64_t r = begin; r < end; ++r) {
    triforce_linear::prefetch_row_ahead(q, r, K, ahead);
    const int8_t* qrow = q + r * K;
    __m512 acc[N_ROWS];
    for (int t = 0; t < N_ROWS; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t s = 0; s < steps; ++s) {
      const __m512bh wv = int8_to_bf16(qrow + 32 * s);
      for (int t = 0; t < N_ROWS; ++t) {
        const __m512bh xv = reinterpret_cast<__m512bh>(
            _mm512_loadu_si512(reinterpret_cast<const __m512i*>(x + t * K) + s));
        acc[t] = _mm512_dpbf16_ps(acc[t], wv, xv);
      }
    }
    for (int t = 0; t < N_ROWS; ++t) y[t * N + r] = _mm512_reduce_add_ps(acc[t]);
  }
}

constexpr int kBf16PassRows = triforce_linear::kAvx512PassRows;
constexpr triforce_linear::RowsFn<at::BFloat16, int8_t, float> kBf16Rows[kBf16PassRows] = {
    bf16_rows<1>, bf16_rows<2>, bf16_rows<3>, bf16_rows<4>,  bf16_rows<5>, bf16_rows<6>,
    bf16_rows<7>, bf16_rows<8>, bf16_rows<9>, bf16_rows<10>, bf16_rows<11>};
#endif

// out[t, j] = y[t, j] * scale[j], rounded to Out once.
template <typename Out>
void scale_rows(const float* y, const float* scale, Out* out, int64_t n, int64_t N) {
  for (int64_t t = 0; t < n; ++t) {
    const float* yt = y + t * N;
    Out* ot = out + t * N;
    int64_t j = 0;
    if constexpr (std::is_same_v<Out, at::BFloat16>) {
      for (; j + 8 <= N; j += 8)
        triforce_vec256::store8(ot + j, _mm256_mul_ps(_mm256_loadu_ps(yt + j), _mm256_loadu_ps(scale + j)));
    }
    for (; j < N; ++j) ot[j] = Out(yt[j] * scale[j]);
  }
}

}  // namespace

at::Tensor linear_i8(at::Tensor x, at::Tensor q, at::Tensor scale, bool float_out) {
  TORCH_CHECK(q.scalar_type() == at::kChar && scale.scalar_type() == at::kFloat, "int8 weights, float32 scales");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "bfloat16 or float32 x");
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && x.size(1) == q.size(1), "x [n, K], q [N, K]");
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == q.size(0) && scale.is_contiguous(), "scale [N]");
  TORCH_CHECK(x.size(1) > 0 && x.size(1) % 16 == 0, "K must be a positive multiple of 16");
  TORCH_CHECK(q.is_contiguous() && x.size(0) >= 1, "q contiguous, at least one row of x");
  x = x.contiguous();
  const int64_t n = x.size(0), K = x.size(1), N = q.size(0);
  const bool as_float = float_out || x.scalar_type() == at::kFloat;
  auto y = at::empty({n, N}, x.options().dtype(at::kFloat));
#if TRIFORCE_WITH_AMX
  if (x.scalar_type() == at::kBFloat16 && K % 32 == 0 && N % 16 == 0 && triforce_amx::usable()) {
    triforce_linear::run_amx_i8(x, q, y);
  } else
#endif
#if defined(__AVX512BF16__)
  if (x.scalar_type() == at::kBFloat16 && K % 32 == 0) {
    triforce_linear::parallel_rows<kBf16PassRows>(kBf16Rows, static_cast<int>(n), x.data_ptr<at::BFloat16>(),
                                                  q.data_ptr<int8_t>(), y.data_ptr<float>(), K, N);
  } else
#endif
  if (x.scalar_type() == at::kFloat) {
    triforce_linear_avx2::run(static_cast<const float*>(x.data_ptr<float>()), static_cast<int>(n),
                              q.data_ptr<int8_t>(), y.data_ptr<float>(), K, N);
  } else {  // the few activation rows, widened once here (a torch op would cost its dispatch on every call)
    std::vector<float> xf(static_cast<size_t>(n * K));
    const auto* xp = x.data_ptr<at::BFloat16>();
    for (size_t i = 0; i < xf.size(); ++i) xf[i] = static_cast<float>(xp[i]);
    triforce_linear_avx2::run(static_cast<const float*>(xf.data()), static_cast<int>(n), q.data_ptr<int8_t>(),
                              y.data_ptr<float>(), K, N);
  }
  auto out = as_float ? y : at::empty({n, N}, x.options());
  if (as_float) scale_rows(y.data_ptr<float>(), scale.data_ptr<float>(), y.data_ptr<float>(), n, N);
  else scale_rows(y.data_ptr<float>(), scale.data_ptr<float>(), out.data_ptr<at::BFloat16>(), n, N);
  return out;
}
