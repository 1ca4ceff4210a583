// The AVX2 + FMA range pass of decode attention (flash_decode.h splits each KV head's keys into ranges and
// merges them), for bfloat16 q, K and V (the `avx2` build's decode_attention_bf16, attention_avx2.cpp) and
// float32 ones (decode_attention_f32, attention_f32.cpp, every build): keys and values stay in memory as
// they are and are widened (or copied) to float32 a block at a time in L1, or, for up to 3 rows of bfloat16
// (a decode step's query heads of one KV head), in registers as the block's one pass reads them (0.87x the
// time of a one-token pass over 8,000 keys on the AVX2 EPYC, docs/avx2.md; the same sums as the copy's
// since the build stopped contracting scalar a * b + c, build.py); scores and the P . V product are
// float32 FMA; the online softmax uses vec256.h's exp. Query rows are widened and pre-scaled once per
// range. Each block of K and V is read once for all R = G * n rows, and each row's sums run in one order
// whatever R is. Included by one source of each build.
#pragma once
#include "aten.h"
#include <immintrin.h>

#include <type_traits>
#include <vector>

#include "flash_decode.h"
#include "vec256.h"

namespace triforce_attention_avx2 {

using triforce_attention::kMaxRows;
using triforce_attention::NextBlock;
using triforce_attention::Partial;
using triforce_attention::TailMask;
using triforce_attention::any_nan;
using triforce_attention::hide_keys;

using triforce_vec256::to_ps;
using triforce_vec256::exp2_softmax_ps;
using triforce_vec256::exp_ps;
using triforce_vec256::hsum;

constexpr int kBlock = 32;  // keys per block: the widened K and V blocks stay in L1

inline __m128 reduce4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {  // lane i: the sum of s_i's lanes
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Scores of ROWS query rows (q, q + D, ...) against 4 keys (rows k, k + k_stride, ...: the widened block's
// floats, or the cache's own rows, widened here): ROWS * 4 independent FMA chains, enough to keep both FMA
// units busy (one row alone would wait on the FMA latency). Two rows hold the 4 keys in registers; three
// hold their q and take one key at a time (12 accumulators, 3 q and a key fill the 16 registers).
template <int D, int ROWS, typename K>
inline void scores4(const float* q, const K* k, int64_t k_stride, float* out, int out_stride) {
  __m256 s[ROWS][4];
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < 4; ++j) s[r][j] = _mm256_setzero_ps();
  for (int c = 0; c < D; c += 8) {
    if constexpr (ROWS <= 2) {
      __m256 kv[4];
      for (int j = 0; j < 4; ++j) kv[j] = to_ps(k + j * k_stride + c);
      for (int r = 0; r < ROWS; ++r) {
        const __m256 qv = _mm256_loadu_ps(q + r * D + c);
        for (int j = 0; j < 4; ++j) s[r][j] = _mm256_fmadd_ps(kv[j], qv, s[r][j]);
      }
    } else {
      __m256 qv[ROWS];
      for (int r = 0; r < ROWS; ++r) qv[r] = _mm256_loadu_ps(q + r * D + c);
      for (int j = 0; j < 4; ++j) {
        const __m256 kv = to_ps(k + j * k_stride + c);
        for (int r = 0; r < ROWS; ++r) s[r][j] = _mm256_fmadd_ps(kv, qv[r], s[r][j]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) _mm_storeu_ps(out + r * out_stride, reduce4(s[r][0], s[r][1], s[r][2], s[r][3]));
}

// One row's scores of a block (kBlock floats, -inf where hidden) become e^(s - m) in place, m the row's
// running max taken over them; st is updated; returns the factor its output so far is scaled by (1 when
// the max did not move, and for a row that has seen no key yet, whose p are all 0).
template <typename T>
inline float softmax_block(float* row, Partial& st) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  __m256 mv = _mm256_set1_ps(st.max);
  for (int j = 0; j < kBlock; j += 8) mv = _mm256_max_ps(mv, _mm256_load_ps(row + j));
  const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
  const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  float m = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
  if (m == kNegInf) {  // every key so far hidden from this row, or a NaN score the max dropped
    if (!any_nan(row, kBlock)) {
      for (int j = 0; j < kBlock; ++j) row[j] = 0.0f;
      return 1.0f;
    }
    m = std::numeric_limits<float>::quiet_NaN();  // the row's output becomes NaN, as torch's does
  }
  const float rescale = m == st.max ? 1.0f : std::exp(st.max - m);
  __m256 sum = _mm256_setzero_ps();
  const __m256 mm = _mm256_set1_ps(m), ninf = _mm256_set1_ps(kNegInf), log2e = _mm256_set1_ps(triforce_exp::kLog2e);
  for (int j = 0; j < kBlock; j += 8) {
    const __m256 s = _mm256_load_ps(row + j);
    const __m256 d = _mm256_sub_ps(s, mm);
    // bfloat16 output: 2^(d log2 e) of degree 4 does (docs/speed.md); float32 keeps e^x's 2 ulps
    const __m256 e = std::is_same_v<T, float> ? exp_ps(d) : exp2_softmax_ps(_mm256_mul_ps(d, log2e));
    const __m256 p = _mm256_and_ps(_mm256_cmp_ps(s, ninf, _CMP_NEQ_UQ), e);
    _mm256_store_ps(row + j, p);
    sum = _mm256_add_ps(sum, p);
  }
  st = {m, st.sum * rescale + hsum(sum)};
  return rescale;
}

// acc[r] = acc[r] * rescale[r] + sum over the block's keys j of p[r][j] * v[j], for ROWS rows, 32 dims at a
// time: ROWS * 4 accumulator chains, and the rows share each load of v. Three rows took 15% off a 7-token
// check's attention at 8K against one row with all D dims at once (benchmarks/attention_bandwidth.py on
// the AMX Xeon at TRIFORCE_CPU_ISA=avx2: 32.3-33.9 ms against 38.5-39.8; 1 and 2 tokens unchanged); two
// rows gained little.
template <int D, int ROWS, typename V>  // V rows v_stride apart: the widened block's, or the cache's own
inline void add_values(const float (*p)[kBlock], const float* rescale, const V* v, int64_t v_stride, int nb,
                       float* acc) {
  for (int h = 0; h < D; h += 32) {
    __m256 o[ROWS][4];
    for (int r = 0; r < ROWS; ++r) {
      const __m256 f = _mm256_set1_ps(rescale[r]);
      for (int c = 0; c < 4; ++c) {
        const __m256 a = _mm256_loadu_ps(acc + r * D + h + 8 * c);
        o[r][c] = rescale[r] == 1.0f ? a : _mm256_mul_ps(a, f);
      }
    }
    for (int j = 0; j < nb; ++j) {
      __m256 vv[4];
      for (int c = 0; c < 4; ++c) vv[c] = to_ps(v + j * v_stride + h + 8 * c);
      for (int r = 0; r < ROWS; ++r) {
        const __m256 pr = _mm256_set1_ps(p[r][j]);
        for (int c = 0; c < 4; ++c) o[r][c] = _mm256_fmadd_ps(pr, vv[c], o[r][c]);
      }
    }
    for (int r = 0; r < ROWS; ++r)
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(acc + r * D + h + 8 * c, o[r][c]);
  }
}

// A RangeFn of flash_decode.h for q, K and V of type T (at::BFloat16 or float), widened to float32.
template <int D, typename T>
void attend_range(const T* q, const T* k, const T* v, int64_t k_row, int R, const TailMask& mask, int64_t begin,
                  int64_t end, float scale, float* acc, Partial* st) {
  std::vector<float> qf(static_cast<size_t>(R) * D);  // widened, pre-scaled query rows
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < D; ++c) qf[r * D + c] = static_cast<float>(q[r * D + c]) * scale;
  alignas(32) float kf[kBlock][D], vf[kBlock][D];
  alignas(32) float scores[kMaxRows][kBlock];
  NextBlock<D, T> next(k, v, k_row, mask.S);
  for (int64_t b0 = begin; b0 < end; b0 += kBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kBlock, end - b0));
    next.next(b0 + kBlock, kBlock, kBlock / 4 + R + (R + 2) / 3);  // asked for through the block's work
    // Up to 3 rows of bfloat16 make one pass over a whole block's K and V: they read the cache's rows and
    // widen them in registers. More rows (and float32, whose copy ran faster) read a widened copy.
    const bool direct = !std::is_same_v<T, float> && R <= 3 && nb == kBlock;
    if (!direct)
      for (int j = 0; j < kBlock; ++j)  // widen the block; a short block's tail is zero keys, masked below
        for (int c = 0; c < D; c += 8) {
          const bool in = j < nb;
          _mm256_store_ps(&kf[j][c], in ? to_ps(k + (b0 + j) * k_row + c) : _mm256_setzero_ps());
          _mm256_store_ps(&vf[j][c], in ? to_ps(v + (b0 + j) * k_row + c) : _mm256_setzero_ps());
        }
    // The block's passes over K and V rows `stride` elements apart (the cache's, or the widened copy's):
    // scores of 4 keys at a time (rows in pairs, or a direct block's 3 rows together), the softmax, P . V
    // (rows in threes, then alone).
    const auto passes = [&](const auto* kb, const auto* vb, int64_t stride) {
      for (int j = 0; j < kBlock; j += 4) {
        next.step();
        int r = 0;
        if (direct && R == 3) scores4<D, 3>(qf.data(), kb + j * stride, stride, &scores[0][j], kBlock), r = 3;
        for (; r + 2 <= R; r += 2) scores4<D, 2>(qf.data() + r * D, kb + j * stride, stride, &scores[r][j], kBlock);
        if (r < R) scores4<D, 1>(qf.data() + r * D, kb + j * stride, stride, &scores[r][j], kBlock);
      }
      hide_keys(scores, R, b0, nb, kBlock, mask);
      alignas(32) float rescale[kMaxRows];
      for (int r = 0; r < R; ++r) {
        next.step();
        rescale[r] = softmax_block<T>(scores[r], st[r]);
      }
      int r = 0;
      for (; r + 3 <= R; r += 3, next.step()) add_values<D, 3>(&scores[r], rescale + r, vb, stride, nb, acc + r * D);
      for (; r < R; ++r, next.step()) add_values<D, 1>(&scores[r], rescale + r, vb, stride, nb, acc + r * D);
    };
    if (direct) passes(k + b0 * k_row, v + b0 * k_row, k_row);
    else passes(&kf[0][0], &vf[0][0], D);
    next.finish();
  }
}

}  // namespace triforce_attention_avx2

