// One key range of decode attention with AMX-BF16 tiles (Intel Sapphire Rapids and later).
//
// The vector kernel's cost grows with every query row, so checking 7 speculated tokens (21 rows for
// SmolLM2's 3 query heads per KV head) cost 2.8x a single-token step at 8K. Tiles compute 16 rows x 16
// keys at once, so up to 16 rows cost about what one does, and a check reads K and V at the same rate
// as a decode step. Per block of 32 keys, for each group of 16 rows:
//   scores^T [32 keys, 16 rows] = K . Q^T: K rows load straight from the cache as A tiles; Q^T is packed
//     once per call into bf16 pairs (the B layout);
//   online softmax in that layout: lane r of every vector is row r, so the running max and sum need no
//     horizontal reductions (a group of at most 8 or 4 rows packs 2 or 4 keys into each vector:
//     softmax_block);
//   out [16 rows, D] += P . V: P is rounded to bf16 and transposed into A tiles (as GPU flash attention
//     rounds P); V's key pairs are interleaved once per block into the B layout, shared by all groups.
#include "amx.h"
#include "attention_common.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

namespace triforce_attention {
namespace {

constexpr int kKeys = 32;  // keys per block: one A tile of P (16 bf16 pairs per row)

// Lanes swapped between the 256-bit halves, and between neighbouring 128-bit quarters.
inline __m512 swap_halves(__m512 x) { return _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)); }
inline __m512 swap_quarters(__m512 x) { return _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)); }

// Floats 0..16/PACK of x (the rows of a packed group), or all 16: loaded replicated into every lane group,
// and stored from the first. (AVX512F only, as below: the build has no -mavx512dq.)
template <int PACK>
inline __m512 load_rows(const float* x) {
  if constexpr (PACK == 1) return _mm512_loadu_ps(x);
  else if constexpr (PACK == 2) return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(x))));
  else return _mm512_broadcast_f32x4(_mm_loadu_ps(x));
}
template <int PACK>
inline void store_rows(float* to, __m512 x) {
  if constexpr (PACK == 1) _mm512_storeu_ps(to, x);
  else if constexpr (PACK == 2) _mm256_storeu_ps(to, _mm512_castps512_ps256(x));
  else _mm_storeu_ps(to, _mm512_castps512_ps128(x));
}

// One group's online softmax over a block (scores [key][row] from the score tiles, raw q . k), its state
// (row_max, row_sum, 16 rows from the group's first, row0) continued, `rescale` and the A tile of P
// (p_tile[r] = row r's bf16 pairs) written. With PACK > 1 (a group of at most 16 / PACK rows: a decode
// step's 3, the last row of an 11-token check's 33) lane q L + r (L = 16 / PACK) holds row r's score of key
// u + q V in vector u of V = 32 / PACK, so the exponentials run over V vectors, not 32. Each row's values
// are the same whatever PACK, bit for bit: its maximum, its exponentials, and its sum, in every PACK the
// sums of keys [0, 8), [8, 16), [16, 24) and [24, 32) in order, added as (s0 + s1) + (s2 + s3); a row's
// result does not depend on the rows beside it (tests/kernels/test_check_rows.py: a check's rows against
// steps).
template <int PACK, typename Next>
inline void softmax_block(const float (*scores)[16], int rows, bool masked, int nb, const TailMask& mask, int row0,
                          int64_t b0, float scale, float* row_max, float* row_sum, float* rescale,
                          int32_t (*p_tile)[16], Next& next) {
  constexpr int L = 16 / PACK, V = kKeys / PACK;
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 s[V], block_max = neg_inf;
  for (int u = 0; u < V; ++u) {
    if constexpr (PACK == 1) {
      s[u] = _mm512_load_ps(scores[u]);
    } else if constexpr (PACK == 2) {
      s[u] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_load_ps(scores[u]))),
                                                 _mm256_castps_pd(_mm256_load_ps(scores[u + V])), 1));
    } else {
      __m512 x = _mm512_castps128_ps512(_mm_load_ps(scores[u]));
      x = _mm512_insertf32x4(x, _mm_load_ps(scores[u + V]), 1);
      x = _mm512_insertf32x4(x, _mm_load_ps(scores[u + 2 * V]), 2);
      s[u] = _mm512_insertf32x4(x, _mm_load_ps(scores[u + 3 * V]), 3);
    }
    if (masked) {  // rows past the group's see every key of the block (their results are dropped)
      __mmask16 hidden = 0;
      for (int l = 0; l < 16; ++l) {
        const int j = u + (l / L) * V, r = l % L;
        if (j >= nb || (r < rows && !mask.sees(row0 + r, b0 + j))) hidden |= static_cast<__mmask16>(1u << l);
      }
      s[u] = _mm512_mask_mov_ps(s[u], hidden, neg_inf);
    }
    block_max = _mm512_max_ps(block_max, s[u]);
  }
  if constexpr (PACK == 4) block_max = _mm512_max_ps(block_max, swap_quarters(block_max));
  if constexpr (PACK >= 2) block_max = _mm512_max_ps(block_max, swap_halves(block_max));
  next.step();
  const __m512 old_max = load_rows<PACK>(row_max);
  // The row maxima in scaled units (scale > 0 and rounding is monotonic: the max of the scaled scores).
  const __m512 new_max = _mm512_max_ps(old_max, _mm512_mul_ps(block_max, _mm512_set1_ps(scale)));
  // Rows with every key so far masked keep max -inf; subtract 0 there so no lane computes inf - inf.
  const __m512 shift = _mm512_mask_mov_ps(new_max, _mm512_cmp_ps_mask(new_max, neg_inf, _CMP_EQ_OQ),
                                          _mm512_setzero_ps());
  const __m512 factor = exp_ps(_mm512_sub_ps(old_max, shift));
  // p = e^(s scale - m) = 2^(s (scale log2 e) - m log2 e): one fused multiply-subtract per score, rounded
  // to bfloat16 for P . V below (0 for a hidden key's -inf, which only blocks with a mask hold)
  const __m512 to_log2 = _mm512_set1_ps(scale * triforce_exp::kLog2e);
  const __m512 shift2 = _mm512_mul_ps(shift, _mm512_set1_ps(triforce_exp::kLog2e));
  constexpr int A = 4 / PACK;  // accumulators: keys [8a, 8a + 8) of every lane group each
  __m512 part[A];
  for (int a = 0; a < A; ++a) {
    part[a] = _mm512_setzero_ps();
    for (int u = 8 * a; u < 8 * a + 8; ++u) {
      const __m512 t = _mm512_fmsub_ps(s[u], to_log2, shift2);
      s[u] = masked ? exp2_softmax_ps(t) : exp2_finite_softmax_ps(t);
      part[a] = _mm512_add_ps(part[a], s[u]);
    }
  }
  __m512 sum;
  if constexpr (PACK == 1) {
    sum = _mm512_add_ps(_mm512_add_ps(part[0], part[1]), _mm512_add_ps(part[2], part[3]));
  } else {
    const __m512 pairs = PACK == 2 ? _mm512_add_ps(part[0], part[1]) : _mm512_add_ps(part[0], swap_quarters(part[0]));
    sum = _mm512_add_ps(pairs, swap_halves(pairs));
  }
  next.step();
  store_rows<PACK>(row_sum, _mm512_fmadd_ps(load_rows<PACK>(row_sum), factor, sum));
  store_rows<PACK>(row_max, new_max);
  store_rows<PACK>(rescale, factor);
  // (x[i], x[16 + i]) pairs of one 32-lane bf16 vector: the layout of _mm512_cvtne2ps_pbh(hi, lo).
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  // pairs[w] lane l = (p[2w + q V][r], p[2w + 1 + q V][r]) in bf16 (q = l / L, r = l % L): pair m = w + q V / 2
  __m512i pairs[V / 2];
  for (int w = 0; w < V / 2; ++w)
    pairs[w] = _mm512_permutexvar_epi16(interleave,
                                        reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(s[2 * w + 1], s[2 * w])));
  next.step();
  if constexpr (PACK == 1) {
    transpose16(pairs);
    for (int r = 0; r < 16; ++r) _mm512_store_si512(p_tile[r], pairs[r]);
  } else {  // the rows' pairs gathered (the tile's other rows are past the group's and dropped)
    alignas(64) int32_t packed[V / 2][16];
    for (int w = 0; w < V / 2; ++w) _mm512_store_si512(packed[w], pairs[w]);
    for (int r = 0; r < rows; ++r)
      for (int m = 0; m < 16; ++m) p_tile[r][m] = packed[m % (V / 2)][(m / (V / 2)) * L + r];
  }
}

}  // namespace

template <int D>
void attend_range_amx(const at::BFloat16* q, const at::BFloat16* k, const at::BFloat16* v, int64_t k_row,
                      int R, const TailMask& mask, int64_t begin, int64_t end, float scale, float* acc,
                      Partial* st) {
  static_assert(D % 64 == 0, "head dim a multiple of 64");
  constexpr int P = D / 32;  // 32-dim slices of a row: A tiles of K per 16 keys, B tiles of Q^T
  const int groups = (R + 15) / 16;
  triforce_amx::configure_tiles();  // tiles: 0 = A (K or P), 1 = B (Q^T or V pairs), 2 = scores, 4..7 = out slices
  // qt[g][h]: B tile, row p = dims (32h + 2p, 32h + 2p + 1) of group g's 16 rows (zero past R): each a
  // 16 x 16 transpose of those rows' bf16 pairs (packed element by element, on every call of a range, it
  // had taken 6% of a pass at 11 new tokens)
  alignas(64) int32_t qt[kMaxRows / 16][P][256];
  const auto* q32 = reinterpret_cast<const int32_t*>(q);
  for (int g = 0; g < groups; ++g)
    for (int h = 0; h < P; ++h) {
      __m512i rows[16];
      for (int r = 0; r < 16; ++r)
        rows[r] = 16 * g + r < R ? _mm512_loadu_si512(q32 + (16 * g + r) * (D / 2) + 16 * h) : _mm512_setzero_si512();
      transpose16(rows);
      for (int p = 0; p < 16; ++p) _mm512_store_si512(&qt[g][h][16 * p], rows[p]);
    }
  alignas(64) float row_max[kMaxRows], row_sum[kMaxRows];
  std::fill_n(row_max, 16 * groups, -std::numeric_limits<float>::infinity());
  std::fill_n(row_sum, 16 * groups, 0.0f);
  for (int r = 0; r < R; ++r) row_max[r] = st[r].max, row_sum[r] = st[r].sum;  // the state it continues
  alignas(64) int32_t vpairs[D / 16][16][16];  // B tiles of V: [16-dim slice][key pair][dim]
  alignas(64) float scores[kKeys][16];          // [key][row]
  alignas(64) int32_t p_tile[16][16];           // A tile of P: [row][key pair]
  alignas(64) float out[16][64];                // one 64-dim slice of P . V for 16 rows
  alignas(64) float rescale[16];
  alignas(64) at::BFloat16 k_pad[kKeys * D], v_pad[kKeys * D];
  const __m512i kPairLo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                           39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i kPairHi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
                                           55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
  NextBlock<D, at::BFloat16> next(k, v, k_row, mask.S);

  for (int64_t b0 = begin; b0 < end; b0 += kKeys) {
    const int nb = static_cast<int>(std::min<int64_t>(kKeys, end - b0));
    const at::BFloat16 *kb = k + b0 * k_row, *vb = v + b0 * k_row;
    int64_t stride = k_row;
    if (nb < kKeys) {  // the range's tail: zero-padded copies, so tiles read no memory past the range
      std::memset(k_pad, 0, sizeof(k_pad));
      std::memset(v_pad, 0, sizeof(v_pad));
      for (int j = 0; j < nb; ++j) {
        std::memcpy(k_pad + j * D, kb + j * k_row, D * sizeof(at::BFloat16));
        std::memcpy(v_pad + j * D, vb + j * k_row, D * sizeof(at::BFloat16));
      }
      kb = k_pad, vb = v_pad, stride = D;
    }
    for (int m = 0; m < kKeys / 2; ++m) {
      const at::BFloat16* v0 = vb + 2 * m * stride;
      for (int h = 0; h < D / 32; ++h) {
        const __m512i a = _mm512_loadu_si512(v0 + 32 * h), b = _mm512_loadu_si512(v0 + stride + 32 * h);
        _mm512_store_si512(vpairs[2 * h][m], _mm512_permutex2var_epi16(a, kPairLo, b));
        _mm512_store_si512(vpairs[2 * h + 1][m], _mm512_permutex2var_epi16(a, kPairHi, b));
      }
    }
    next.next(b0 + kKeys, kKeys, 9 * groups);  // the next block, through this one's work
    const bool masked = nb < kKeys || b0 + kKeys - 1 >= mask.first();
    for (int g = 0; g < groups; ++g) {
      for (int t = 0; t < kKeys / 16; ++t) {
        _tile_zero(2);
        for (int h = 0; h < P; ++h) {
          _tile_loadd(0, kb + 16 * t * stride + 32 * h, stride * sizeof(at::BFloat16));
          _tile_loadd(1, qt[g][h], 64);
          _tile_dpbf16ps(2, 0, 1);
        }
        _tile_stored(2, scores[16 * t], 64);
        next.step();
      }
      const int rows = std::min(16, R - 16 * g);
      auto softmax = [&](auto pack) {  // the group's packing (softmax_block), one argument list for all three
        softmax_block<decltype(pack)::value>(scores, rows, masked, nb, mask, 16 * g, b0, scale, &row_max[16 * g],
                                             &row_sum[16 * g], rescale, p_tile, next);
      };
      if (rows <= 4) softmax(std::integral_constant<int, 4>{});
      else if (rows <= 8) softmax(std::integral_constant<int, 2>{});
      else softmax(std::integral_constant<int, 1>{});
      for (int slice = 0; slice < D / 64; ++slice) {
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        _tile_loadd(0, p_tile, 64);
        _tile_loadd(1, vpairs[4 * slice], 64);
        _tile_dpbf16ps(4, 0, 1);
        _tile_loadd(1, vpairs[4 * slice + 1], 64);
        _tile_dpbf16ps(5, 0, 1);
        _tile_loadd(1, vpairs[4 * slice + 2], 64);
        _tile_dpbf16ps(6, 0, 1);
        _tile_loadd(1, vpairs[4 * slice + 3], 64);
        _tile_dpbf16ps(7, 0, 1);
        _tile_stored(4, &out[0][0], 256);
        _tile_stored(5, &out[0][16], 256);
        _tile_stored(6, &out[0][32], 256);
        _tile_stored(7, &out[0][48], 256);
        for (int r = 0; r < rows; ++r) {
          float* a = acc + static_cast<int64_t>(16 * g + r) * D + 64 * slice;
          const __m512 f = _mm512_set1_ps(rescale[r]);
          for (int c = 0; c < 4; ++c)
            _mm512_storeu_ps(a + 16 * c, _mm512_fmadd_ps(_mm512_loadu_ps(a + 16 * c), f, _mm512_load_ps(&out[r][16 * c])));
          if (r % 4 == 3) next.step();
        }
      }
    }
    next.finish();
  }
  _tile_release();
  for (int r = 0; r < R; ++r) st[r] = {row_max[r], row_sum[r]};
}

template void attend_range_amx<64>(const at::BFloat16*, const at::BFloat16*, const at::BFloat16*, int64_t, int,
                                   const TailMask&, int64_t, int64_t, float, float*, Partial*);
template void attend_range_amx<128>(const at::BFloat16*, const at::BFloat16*, const at::BFloat16*, int64_t, int,
                                    const TailMask&, int64_t, int64_t, float, float*, Partial*);

}  // namespace triforce_attention
