// Decode attention for bfloat16 on AVX512-BF16 CPUs: n new queries over S cached keys, new last.
//
// out[Hq, n, D] = softmax(scale * q k^T, masked) v, where query i of the n new ones sees every key before
// the last m and, among those, what its row of the mask allows (without a mask, m = n: keys [0, S - n + i]).
// Grouped-query attention: the G query heads of a KV head and their n queries are the
// R = G * n rows that share one pass over that head's keys and values. Each head's keys are split into
// ranges processed in parallel with an online softmax (flash-decoding); the partial results are merged
// at the end. K and V are each read once, in blocks, so the pass runs near memory bandwidth.
// A range is computed with AMX tiles where the CPU has them (attention_amx.cpp), else with AVX512-BF16
// vector dot products (below), whose cost grows with every row: 2 to 4 rows share each pass so the
// dot products' latency is hidden (one row alone waited on it; 20-25% slower at 8 to 16 new tokens).
#include "kernels.h"  // what this file defines, declared as its callers see it
#include <immintrin.h>

#include "amx.h"
#include "attention_common.h"

#include <cmath>
#include <limits>
#include <vector>

namespace triforce_attention {
namespace {

constexpr int kBlock = 64;  // keys per block (scores of a block stay in L1)

// Scores of ROWS rows r0.. against the 16 transposed keys kt: 2 * ROWS independent dot-product chains,
// enough to hide the instruction's latency (one row alone would wait on it).
template <int D, int ROWS>
inline void score_rows(const at::BFloat16* q, const __m512i* kt, int r0, float scale, float (*scores)[kBlock],
                       int j0, NextBlock<D, at::BFloat16>& next) {
  next.step();
  constexpr int P = D / 2;
  __m512 a[ROWS][2];
  const int32_t* qr[ROWS];
  for (int t = 0; t < ROWS; ++t) {
    a[t][0] = a[t][1] = _mm512_setzero_ps();
    qr[t] = reinterpret_cast<const int32_t*>(q + static_cast<int64_t>(r0 + t) * D);
  }
  for (int p = 0; p < P; p += 2)
    for (int t = 0; t < ROWS; ++t) {
      a[t][0] = _mm512_dpbf16_ps(a[t][0], reinterpret_cast<__m512bh>(kt[p]),
                                 reinterpret_cast<__m512bh>(_mm512_set1_epi32(qr[t][p])));
      a[t][1] = _mm512_dpbf16_ps(a[t][1], reinterpret_cast<__m512bh>(kt[p + 1]),
                                 reinterpret_cast<__m512bh>(_mm512_set1_epi32(qr[t][p + 1])));
    }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int t = 0; t < ROWS; ++t)
    _mm512_storeu_ps(&scores[r0 + t][j0], _mm512_mul_ps(_mm512_add_ps(a[t][0], a[t][1]), sc));
}

// scores[r][0..nk) = scale * q_r . k_j for nk <= 16 keys starting at k. Keys are transposed into
// "pair-major" order (lane j of kt[p] = bf16 pair p of key j) so one dot-product instruction yields 16
// keys' partial scores for a row and no horizontal sums are needed.
template <int D>
inline void score16(const at::BFloat16* q, const at::BFloat16* k, int64_t k_row, int nk, int R, float scale,
                    float (*scores)[kBlock], int j0, NextBlock<D, at::BFloat16>& next) {
  constexpr int P = D / 2;  // bf16 pairs per row
  __m512i kt[P];
  for (int h = 0; h < P / 16; ++h) {
    __m512i* blk = kt + 16 * h;
    for (int i = 0; i < 16; ++i)
      blk[i] = i < nk ? _mm512_loadu_si512(reinterpret_cast<const int32_t*>(k + i * k_row) + 16 * h)
                      : _mm512_setzero_si512();
    transpose16(blk);
  }
  int r = 0;
  for (; r + 4 <= R; r += 4) score_rows<D, 4>(q, kt, r, scale, scores, j0, next);
  switch (R - r) {
    case 3: score_rows<D, 3>(q, kt, r, scale, scores, j0, next); break;
    case 2: score_rows<D, 2>(q, kt, r, scale, scores, j0, next); break;
    case 1: score_rows<D, 1>(q, kt, r, scale, scores, j0, next); break;
  }
}

// acc[r0..r0+ROWS) = acc * rescale + P . V for one block: each row's probabilities rounded to bfloat16
// pairs (p[2m], p[2m+1]), as GPU flash attention rounds P before its P . V product; ROWS * D / 16
// independent chains.
template <int D, int ROWS>
inline void pv_rows(float (*scores)[kBlock], const __m512i (*vpairs)[D / 16], const float* rescales, int r0, int nb,
                    float* acc, NextBlock<D, at::BFloat16>& next) {
  next.step();
  constexpr int DV = D / 16;
  const int pairs = (nb + 1) / 2;
  alignas(64) at::BFloat16 pb[ROWS][kBlock];
  __m512 o[ROWS][DV];
  for (int t = 0; t < ROWS; ++t) {
    float* sr = scores[r0 + t];
    if (nb % 2) sr[nb] = 0.0f;
    for (int j = 0; j < 2 * pairs; j += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb[t] + j),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(sr + j))));
    float* ar = acc + static_cast<int64_t>(r0 + t) * D;
    const __m512 f = _mm512_set1_ps(rescales[r0 + t]);
    for (int c = 0; c < DV; ++c) o[t][c] = _mm512_mul_ps(_mm512_loadu_ps(ar + 16 * c), f);
  }
  for (int m = 0; m < pairs; ++m)
    for (int t = 0; t < ROWS; ++t) {
      const __m512bh pp = reinterpret_cast<__m512bh>(_mm512_set1_epi32(reinterpret_cast<const int32_t*>(pb[t])[m]));
      for (int c = 0; c < DV; ++c) o[t][c] = _mm512_dpbf16_ps(o[t][c], reinterpret_cast<__m512bh>(vpairs[m][c]), pp);
    }
  for (int t = 0; t < ROWS; ++t)
    for (int c = 0; c < DV; ++c) _mm512_storeu_ps(acc + static_cast<int64_t>(r0 + t) * D + 16 * c, o[t][c]);
}

// Rows r = (group member, query i) of KV head h, keys [begin, end); continues st and acc [R, D] float.
template <int D>
void attend_range(const at::BFloat16* q, const at::BFloat16* k, const at::BFloat16* v, int64_t k_row,
                  int R, const TailMask& mask, int64_t begin, int64_t end, float scale, float* acc, Partial* st) {
  constexpr int DV = D / 16;  // float vectors per row
  alignas(64) float scores[kMaxRows][kBlock];
  alignas(64) __m512i vpairs[kBlock / 2][DV];
  float rescales[kMaxRows];
  NextBlock<D, at::BFloat16> next(k, v, k_row, mask.S);
  const int groups = (R + 3) / 4;  // the calls of score_rows per 16 keys, and about those of pv_rows at head
  // dim 64 (at 128 it runs two rows at a time, and the block's lines are all asked for sooner)
  for (int64_t b0 = begin; b0 < end; b0 += kBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kBlock, end - b0));
    next.next(b0 + kBlock, kBlock, 4 * groups + R + groups);  // asked for through the block's work
    for (int j0 = 0; j0 < nb; j0 += 16)
      score16<D>(q, k + (b0 + j0) * k_row, k_row, std::min(16, nb - j0), R, scale, scores, j0, next);
    const int width = (nb + 15) / 16 * 16;  // whole vectors: the padding keys get -inf
    hide_keys(scores, R, b0, nb, width, mask);
    for (int r = 0; r < R; ++r) {
      next.step();
      __m512 mv = _mm512_set1_ps(st[r].max);
      for (int j = 0; j < width; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(&scores[r][j]));
      float m = _mm512_reduce_max_ps(mv);
      if (m == -std::numeric_limits<float>::infinity()) {  // every key of this block masked, or a NaN score
        if (!any_nan(scores[r], nb)) {                        // the max dropped
          for (int j = 0; j < nb; ++j) scores[r][j] = 0.0f;
          rescales[r] = 1.0f;
          continue;
        }
        m = std::numeric_limits<float>::quiet_NaN();  // the row's output becomes NaN, as torch's does
      }
      const float rescale = std::exp(st[r].max - m);
      // p = e^(s - m) = 2^((s - m) log2 e), the probabilities that P . V rounds to bfloat16 (0 for a hidden
      // key's -inf)
      const __m512 mm = _mm512_set1_ps(m), log2e = _mm512_set1_ps(triforce_exp::kLog2e);
      __m512 sum = _mm512_setzero_ps();
      for (int j = 0; j < width; j += 16) {
        const __m512 s = _mm512_loadu_ps(&scores[r][j]);
        const __m512 p = exp2_softmax_ps(_mm512_mul_ps(_mm512_sub_ps(s, mm), log2e));
        _mm512_storeu_ps(&scores[r][j], p);
        sum = _mm512_add_ps(sum, p);
      }
      st[r] = {m, st[r].sum * rescale + _mm512_reduce_add_ps(sum)};
      rescales[r] = rescale;
    }
    // P . V with bfloat16 dot products over pairs of keys: lane i of vpairs[m][c] is the pair
    // (v[2m][16c + i], v[2m + 1][16c + i]), and each row's probabilities are rounded to bfloat16 pairs
    // (p[2m], p[2m + 1]), as GPU flash attention rounds P before its P . V product.
    const int pairs = (nb + 1) / 2;
    for (int m = 0; m < pairs; ++m) {
      const at::BFloat16* v0 = v + (b0 + 2 * m) * k_row;
      const bool odd_tail = 2 * m + 1 >= nb;
      for (int c = 0; c < DV; ++c) {
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0 + 16 * c)));
        const __m512i hi = odd_tail ? _mm512_setzero_si512()
                                    : _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                          reinterpret_cast<const __m256i*>(v0 + k_row + 16 * c)));
        vpairs[m][c] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
      }
    }
    int r = 0;  // four rows at a time at head dim 64 (16 accumulators; at 128, 32 would spill): a prefill
    // chunk's pieces 8% and a 7-token check 4% faster than two on the 2-core Zen 4 (each row's sums alike)
    if constexpr (D == 64)
      for (; r + 4 <= R; r += 4) pv_rows<D, 4>(scores, vpairs, rescales, r, nb, acc, next);
    for (; r + 2 <= R; r += 2) pv_rows<D, 2>(scores, vpairs, rescales, r, nb, acc, next);
    if (r < R) pv_rows<D, 1>(scores, vpairs, rescales, r, nb, acc, next);
    next.finish();
  }
}

}  // namespace
}  // namespace triforce_attention

using namespace triforce_attention;

std::vector<at::Tensor> decode_attention_batch_bf16(const std::vector<at::Tensor>& qs, const std::vector<at::Tensor>& ks,
                                                    const std::vector<at::Tensor>& vs, double scale, bool allow_amx,
                                                    const std::vector<std::optional<at::Tensor>>& masks) {
#if TRIFORCE_WITH_AMX
  if (allow_amx && triforce_amx::usable())
    return decode_attention_batch(qs, ks, vs, scale, masks, attend_range_amx<64>, attend_range_amx<128>);
#endif
  return decode_attention_batch(qs, ks, vs, scale, masks, attend_range<64>, attend_range<128>);
}
