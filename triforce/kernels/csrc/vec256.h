// AVX2 + FMA helpers shared by the `avx2` build's kernels (attention_avx2.cpp, linear_avx2.cpp) and every
// build's fused_bf16.cpp, linear_f32.cpp and linear_i8.cpp: the counterparts of vec512.h.
#pragma once
#include "aten.h"
#include <immintrin.h>

#include "exp_poly.h"

namespace triforce_vec256 {

inline __m256 bf16_to_ps(const at::BFloat16* p) {  // 8 bf16 -> 8 floats (a bf16 is a float's top half)
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// 8 weights as floats, whichever type they are stored in (linear_avx2.h).
inline __m256 to_ps(const at::BFloat16* p) { return bf16_to_ps(p); }
inline __m256 to_ps(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 to_ps(const int8_t* p) {  // int8 weights (linear_i8.cpp): exact in float32
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Round to nearest even at bfloat16 precision, 8 lanes, kept as float32 bit patterns: what bf16(x) does
// for any x but NaN (fused_bf16.cpp: silu of a finite value is finite; rope's sum is NaN only where both
// products overflow with opposite signs, which cos and sin within [-1, 1] never make; linear_i8.cpp: a
// product of finite weights and activations).
inline __m256i round_bits(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
  return _mm256_and_si256(rounded, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
}

inline __m256 round8(__m256 x) { return _mm256_castsi256_ps(round_bits(x)); }

inline void store8(at::BFloat16* out, __m256 x) {  // rounded to bfloat16 as bf16(x) rounds
  const __m256i y = _mm256_srli_epi32(round_bits(x), 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 2^t for 8 floats t <= 0, the softmax probabilities of exp_poly.h's kPow2Poly (relative error within
// 2.7e-6), clamped at 2^kPow2Min (the caller masks hidden keys); NaN for NaN.
inline __m256 exp2_softmax_ps(__m256 t) {
  using namespace triforce_exp;
  const __m256 x = _mm256_max_ps(_mm256_set1_ps(kPow2Min), t);
  const __m256 k = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, k);
  __m256 p = _mm256_set1_ps(kPow2Poly[0]);
  for (int i = 1; i <= kPow2Degree; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kPow2Poly[i]));
  // 2^k, k in [kPow2Min, 0]: an exponent field
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// e^x for 8 floats (exp_poly.h), as vec512.h's: inf past ln(FLT_MAX) (x is clamped at kMax, k <= 128, and 2^k
// is applied as two halves that each fit the exponent field), NaN for NaN (each clamp returns its second
// operand, x, when x is NaN), and clamped below at kMin.
inline __m256 exp_ps(__m256 x) {
  using namespace triforce_exp;
  x = _mm256_min_ps(_mm256_set1_ps(kMax), _mm256_max_ps(_mm256_set1_ps(kMin), x));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Hi), x));
  __m256 p = _mm256_set1_ps(kPoly[0]);
  for (int i = 1; i <= kDegree; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kPoly[i]));
  // 2^k = 2^h * 2^(k - h), h = floor(k / 2): both in [-63, 64] for k in [-126, 128], each an exponent field
  const __m256i ki = _mm256_cvtps_epi32(k), h = _mm256_srai_epi32(ki, 1), bias = _mm256_set1_epi32(127);
  const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
  const __m256 e2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ki, h), bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, e1), e2);
}

}  // namespace triforce_vec256
