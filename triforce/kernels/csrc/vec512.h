// AVX-512 helpers shared by the CPU kernels (attention, fused element-wise steps).
#pragma once
#include "aten.h"
#include <immintrin.h>

#include "exp_poly.h"

namespace triforce_vec {

// e^x for 16 floats (exp_poly.h; inf past ln(FLT_MAX), by the scaling; NaN for NaN, the clamp's second operand).
inline __m512 exp_ps(__m512 x) {
  using namespace triforce_exp;
  x = _mm512_max_ps(_mm512_set1_ps(kMin), x);
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Hi), x));
  __m512 p = _mm512_set1_ps(kPoly[0]);
  for (int i = 1; i <= kDegree; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[i]));
  return _mm512_scalef_ps(p, k);
}

// 2^t for 16 floats, the softmax probabilities of exp_poly.h's kPow2Poly (relative error within 2.7e-6),
// for t that is not -inf (there 2^kPow2Min; NaN stays NaN).
inline __m512 exp2_finite_softmax_ps(__m512 t) {
  using namespace triforce_exp;
  const __m512 x = _mm512_max_ps(_mm512_set1_ps(kPow2Min), t);
  const __m512 k = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, k);
  __m512 p = _mm512_set1_ps(kPow2Poly[0]);
  for (int i = 1; i <= kPow2Degree; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kPow2Poly[i]));
  return _mm512_scalef_ps(p, k);
}

// The same, and 2^-inf is +0 (fixupimm's response 8 for the class "negative infinity" of t): a hidden key's.
inline __m512 exp2_softmax_ps(__m512 t) {
  return _mm512_fixupimm_ps(exp2_finite_softmax_ps(t), t, _mm512_set1_epi32(8 << 16), 0);
}

inline __m512 bf16_to_ps(const at::BFloat16* p) {  // 16 bf16 -> 16 floats
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

#if defined(__AVX512BF16__)
inline __m512bh int8_to_bf16(const int8_t* p) {  // 32 int8 -> 32 bfloat16, in order (exact: |q| <= 127)
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  return _mm512_cvtne2ps_pbh(hi, lo);
}
#endif

// In place: r[i][j] -> r[j][i] for a 16 x 16 matrix of 32-bit elements.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + c], 128-bit lane L: column 4L + c of rows 4i..4i+3
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
    t[8 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
    r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xdd);
  }
}

}  // namespace triforce_vec
