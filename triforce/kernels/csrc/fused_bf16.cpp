// Small bfloat16 element-wise steps of a decoder layer, each one call instead of 3 to 8 torch ops.
//
// A decode step spends as long in per-op overhead as in these ops' arithmetic, so each is fused. The
// rounding follows the torch expressions they replace (models/llama.py, models/rope.py) step by step:
// every intermediate that torch rounds to bfloat16 is rounded here too.
#include "kernels.h"  // what this file defines, declared as its callers see it
#include <immintrin.h>

// Compiled in every build of kernels/cpu.py: silu_mul takes 16 lanes with AVX512-BF16, 8 with AVX2.
#if defined(__AVX512BF16__)
#include "vec512.h"
#endif
#include "vec256.h"  // AVX2, which every level has: rope's 8 lanes

#include <algorithm>
#include <cmath>

using bf16 = at::BFloat16;

namespace {
inline float round_bf16(float x) { return static_cast<float>(bf16(x)); }

using triforce_vec256::round8;
using triforce_vec256::store8;

// One rope row, 8 lanes of each half at a time (half % 8 == 0), rounded as the scalar loop of rope_bf16:
// x * c and rot * s each to bfloat16 (both products are exact in float32: 8-bit mantissas), their sum too.
inline void rope_row8(const bf16* x, const bf16* c, const bf16* s, bf16* o, int64_t half) {
  using triforce_vec256::bf16_to_ps;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < half; i += 8) {
    const __m256 x1 = bf16_to_ps(x + i), x2 = bf16_to_ps(x + half + i);
    store8(o + i, _mm256_add_ps(round8(_mm256_mul_ps(x1, bf16_to_ps(c + i))),
                                round8(_mm256_mul_ps(_mm256_xor_ps(x2, sign), bf16_to_ps(s + i)))));
    store8(o + half + i, _mm256_add_ps(round8(_mm256_mul_ps(x2, bf16_to_ps(c + half + i))),
                                       round8(_mm256_mul_ps(x1, bf16_to_ps(s + half + i)))));
  }
}

#if defined(__AVX512BF16__)
constexpr int kLanes = 16;

inline __m512 round_ps(__m512 x) {  // to bfloat16 and back, 16 lanes
  const __m256i b = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// silu(gate) * up for 16 lanes, rounded as torch rounds (see silu_mul_bf16).
inline void silu_mul_lanes(const bf16* gate, const bf16* up, bf16* out) {
  const __m512 g = triforce_vec::bf16_to_ps(gate);
  const __m512 e = triforce_vec::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  const __m512 silu = round_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
  const __m256bh y = _mm512_cvtneps_pbh(_mm512_mul_ps(silu, triforce_vec::bf16_to_ps(up)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), reinterpret_cast<__m256i>(y));
}
#else
constexpr int kLanes = 8;

inline void silu_mul_lanes(const bf16* gate, const bf16* up, bf16* out) {
  const __m256 g = triforce_vec256::bf16_to_ps(gate);
  const __m256 e = triforce_vec256::exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  const __m256 silu = round8(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
  store8(out, _mm256_mul_ps(silu, triforce_vec256::bf16_to_ps(up)));
}
#endif
}  // namespace

// weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(bf16), rows of x: [n, H], 8 lanes at a time (a
// scalar loop until 2026-12-06, while the other core waited: with silu * up below, 5.7 ms of a batch's
// forward of 40 rows, now 2.7, on the 2-core AMX Xeon; `python benchmarks/kernel_ab.py --kernel
// elementwise`). The squares are exact in float32 (a bfloat16 has 8 significant bits); their sum runs in
// 8 lanes and then across them, as torch's reduction sums in lanes too (in another order: the test holds
// nearly every bit to torch's). Each row alone: a row's result does not depend on the others.
at::Tensor rms_norm_bf16(at::Tensor x, at::Tensor weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && x.size(1) == weight.size(0), "x [n, H], weight [H]");
  using triforce_vec256::bf16_to_ps;
  x = x.contiguous();
  const int64_t n = x.size(0), h = x.size(1);
  auto out = at::empty_like(x);
  const bf16* xp = x.data_ptr<bf16>();
  const auto w = weight.contiguous();  // held: a copy of a strided weight lives while it is read
  const bf16* wp = w.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  for (int64_t r = 0; r < n; ++r) {
    const bf16* row = xp + r * h;
    bf16* o = op + r * h;
    __m256 squares = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= h; i += 8) {
      const __m256 v = bf16_to_ps(row + i);
      squares = _mm256_fmadd_ps(v, v, squares);
    }
    float ss = triforce_vec256::hsum(squares);
    for (; i < h; ++i) ss += static_cast<float>(row[i]) * static_cast<float>(row[i]);
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(h) + static_cast<float>(eps));
    const __m256 sv = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= h; i += 8)
      store8(o + i, _mm256_mul_ps(bf16_to_ps(wp + i), round8(_mm256_mul_ps(bf16_to_ps(row + i), sv))));
    for (; i < h; ++i) o[i] = bf16(static_cast<float>(wp[i]) * round_bf16(static_cast<float>(row[i]) * scale));
  }
  return out;
}

// silu(gate) * up for gate_up = [gate | up]: [n, 2I] -> [n, I]. kLanes at a time: e^-g by the
// polynomial of vec512.h / vec256.h (within 2 float ulps), both roundings to bf16 to nearest even, as
// torch rounds, so results match torch's bit for bit nearly always.
at::Tensor silu_mul_bf16(at::Tensor gate_up) {
  TORCH_CHECK(gate_up.scalar_type() == at::kBFloat16 && gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "bfloat16 [n, 2I]");
  gate_up = gate_up.contiguous();
  const int64_t n = gate_up.size(0), half = gate_up.size(1) / 2;
  auto out = at::empty({n, half}, gate_up.options());
  const bf16* gp = gate_up.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  // rows shared between the threads from about 8K outputs on (a batch's rows; a decode step's row stays on
  // the calling thread, where starting the other would cost more than its share)
  at::parallel_for(0, n, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, half)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const bf16* gate = gp + r * 2 * half;
      const bf16* up = gate + half;
      bf16* o = op + r * half;
      int64_t i = 0;
      for (; i + kLanes <= half; i += kLanes) silu_mul_lanes(gate + i, up + i, o + i);
      for (; i < half; ++i) {
        const float g = static_cast<float>(gate[i]);
        o[i] = bf16(round_bf16(g / (1.0f + std::exp(-g))) * static_cast<float>(up[i]));
      }
    }
  });
  return out;
}

// x * cos + cat(-x2, x1) * sin for H heads of n rows of D elements: row (h, t) of x at x + h * xh + t * xt,
// of the output at o + h * oh + t * ot; cos and sin [n, D] contiguous. The decoder's layer loop rotates a
// sequence's queries and keys straight into their buffers with it (its cache's, at the write offset).
void rope_into(const bf16* x, int64_t xh, int64_t xt, const bf16* cp, const bf16* sp, int64_t H, int64_t n,
               int64_t D, bf16* op, int64_t oh, int64_t ot) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < n; ++t) {
      const bf16* row = x + h * xh + t * xt;
      const bf16* c = cp + t * D;
      const bf16* s = sp + t * D;
      bf16* o = op + h * oh + t * ot;
      if (half % 8 == 0) {  // head_dim 64 or 128: 8 lanes (a streaming draft rotates its window every step)
        rope_row8(row, c, s, o, half);
        continue;
      }
      for (int64_t i = 0; i < D; ++i) {
        const float rot = i < half ? -static_cast<float>(row[i + half]) : static_cast<float>(row[i - half]);
        const float a = round_bf16(static_cast<float>(row[i]) * static_cast<float>(c[i]));
        const float b = round_bf16(rot * static_cast<float>(s[i]));
        o[i] = bf16(a + b);
      }
    }
}

// x * cos + cat(-x2, x1) * sin for x [H, n, D] (any strides), cos and sin [n, D]: a new [H, n, D].
at::Tensor rope_bf16(at::Tensor x, at::Tensor cos, at::Tensor sin) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && cos.scalar_type() == at::kBFloat16 &&
              sin.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 3 && cos.dim() == 2 && cos.size(0) == x.size(1) && cos.size(1) == x.size(2) &&
              sin.sizes() == cos.sizes() && x.size(2) % 2 == 0, "x [H, n, D], cos and sin [n, D]");
  const int64_t H = x.size(0), n = x.size(1), D = x.size(2);
  TORCH_CHECK(x.stride(2) == 1, "x rows must be contiguous");
  cos = cos.contiguous();
  sin = sin.contiguous();
  auto out = at::empty({H, n, D}, x.options());
  rope_into(x.data_ptr<bf16>(), x.stride(0), x.stride(1), cos.data_ptr<bf16>(), sin.data_ptr<bf16>(), H, n, D,
            out.data_ptr<bf16>(), n * D, D);
  return out;
}
