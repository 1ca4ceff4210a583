// The part of decode attention that every instruction-set level shares (attention_bf16.cpp for
// AVX512-BF16 and AMX, attention_avx2.cpp for AVX2, attention_f32.cpp for float32): argument checks, the split of each KV head's keys
// into ranges processed in parallel (flash-decoding), and the merge of the ranges' partial results.
// A level supplies only the range function: the online-softmax pass over keys [begin, end) of one head.
#pragma once
#include "aten.h"
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

namespace triforce_attention {

constexpr int kMaxRows = 128;  // G * n: query rows that share one pass over a KV head
constexpr int64_t kSpan = 512;  // keys per range processed in parallel (a multiple of every level's block)

struct Partial {  // one row's online-softmax state over a range of keys
  float max, sum;
};

// Which of a KV head's S keys row r (query r % n of the n new ones) sees: every key before the last m;
// among the last m (the new tokens last), those its mask row allows, or without a mask (a chain, m == n)
// the new tokens up to its own. Only blocks that reach key `first()` need a look.
struct TailMask {
  const bool* bits;  // [n, m] row-major, or nullptr: causal
  int n, m;
  int64_t S;
  int64_t first() const { return S - m; }
  bool sees(int r, int64_t key) const {
    const int64_t t = key - (S - m);
    if (t < 0) return true;
    const int i = r % n;
    return bits ? bits[static_cast<int64_t>(i) * m + t] : t <= i;
  }
};

// scores[r][j] = -inf for the keys b0 + j (j < nb) that row r does not see, and for the padding j in
// [nb, width). Row-major score blocks of the vector kernels.
template <int W>
inline void hide_keys(float (*scores)[W], int R, int64_t b0, int nb, int width, const TailMask& mask) {
  if (b0 + nb - 1 < mask.first() && nb == width) return;
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < width; ++j)
      if (j >= nb || !mask.sees(r, b0 + j)) scores[r][j] = -std::numeric_limits<float>::infinity();
}

// Asks for K and V of keys [from, from + keys) of one head (rows of k_row elements) while the range
// function computes on the keys before them, where the hardware prefetcher alone left it waiting on
// memory: the next block, asked for at the start of each, raised the AMX tile path's read rate at 8K by
// 15% (12 interleaved development runs), and took 8-25% off the AVX512-BF16 vector path's time on an
// AMX Xeon (benchmarks/attention_bandwidth.py, n = 1, 2 and 7, two interleaved runs). The AVX2 path,
// which widens each block into L1 first, gained nothing measurable from it, as a burst or spread out.
template <int D, typename T>
inline void prefetch_keys(const T* k, const T* v, int64_t k_row, int64_t from, int keys, int64_t end) {
  if (from + keys > end) return;
  for (int64_t key = from; key < from + keys; ++key) {
    const char* kb = reinterpret_cast<const char*>(k + key * k_row);
    const char* vb = reinterpret_cast<const char*>(v + key * k_row);
    for (int j = 0; j < D * static_cast<int>(sizeof(T)); j += 64) {  // a row's 64-byte lines
      _mm_prefetch(kb + j, _MM_HINT_T0);
      _mm_prefetch(vb + j, _MM_HINT_T0);
    }
  }
}

// Online-softmax state of each of the R = G * n rows over keys [begin, end) of one KV head, and the
// unnormalised output acc [R, D] (zeroed by the caller); keys a row does not see (`mask`) are skipped.
template <typename T>  // the element type of q, K, V and the output: at::BFloat16, or float (attention_f32.cpp)
using RangeFn = void (*)(const T* q, const T* k, const T* v, int64_t k_row,
                         int R, const TailMask& mask, int64_t begin, int64_t end, float scale, float* acc,
                         Partial* st);

template <int D, typename T>
void flash_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, float scale,
                  const TailMask& mask, RangeFn<T> range, at::Tensor& out) {
  const int64_t hq = q.size(0), n = q.size(1), hkv = k.size(0), S = k.size(1);
  const int G = static_cast<int>(hq / hkv), R = static_cast<int>(G * n);
  // Key ranges of kSpan keys at fixed offsets (0, kSpan, 2 kSpan, ...), not sized by S: a row's sums then
  // run in one order however many keys follow the ones it sees, so a check of n tokens gives each token
  // the attention a one-token step gives it, bit for bit (keys a row does not see add exact zeros).
  const int64_t span = kSpan, splits = (S + span - 1) / span;
  // Each range's [R, D] sums, zeroed by the thread that fills them (a buffer of ceil(S / 512) ranges per
  // head: 50 MB at 64K keys, 8 KV heads and 96 rows, which one thread zeroing up front took 30 ms of).
  std::unique_ptr<float[]> acc(new float[static_cast<size_t>(hkv * splits * R * D)]);
  std::vector<Partial> st(static_cast<size_t>(hkv * splits * R));
  const auto* qp = q.data_ptr<T>();
  const auto* kp = k.data_ptr<T>();
  const auto* vp = v.data_ptr<T>();
  at::parallel_for(0, hkv * splits, 1, [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      const int64_t h = item / splits, sp = item % splits;
      const int64_t begin = sp * span, end = std::min(S, begin + span);
      float* sums = acc.get() + item * R * D;
      std::fill_n(sums, R * D, 0.0f);
      range(qp + h * G * n * D, kp + h * k.stride(0), vp + h * v.stride(0), k.stride(1), R, mask, begin, end,
            scale, sums, st.data() + item * R);
    }
  });
  auto* op = out.data_ptr<T>();
  at::parallel_for(0, hkv * R, 1, [&](int64_t b, int64_t e) {
    for (int64_t hr = b; hr < e; ++hr) {
      const int64_t h = hr / R, r = hr % R;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t sp = 0; sp < splits; ++sp) m = std::max(m, st[(h * splits + sp) * R + r].max);
      float total = 0.0f;
      float row[256] = {0.0f};
      for (int64_t sp = 0; sp < splits; ++sp) {
        const Partial& p = st[(h * splits + sp) * R + r];
        if (p.sum == 0.0f) continue;
        const float w = std::exp(p.max - m);
        total += p.sum * w;
        const float* a = acc.get() + ((h * splits + sp) * R + r) * D;
        for (int c = 0; c < D; ++c) row[c] += w * a[c];
      }
      T* o = op + (h * R + r) * D;  // rows of head h are query heads h*G.. with n queries each
      for (int c = 0; c < D; ++c) o[c] = T(row[c] / total);
    }
  });
}

// Checks the arguments of decode_attention_bf16 / _f32 and runs it with the range function for the head dim.
// mask: [n, m] bool over the last m keys (n <= m <= S), or none for a chain.
template <typename T>
inline at::Tensor decode_attention(at::Tensor q, const at::Tensor& k, const at::Tensor& v, double scale,
                                   const std::optional<at::Tensor>& mask, RangeFn<T> range64, RangeFn<T> range128) {
  constexpr auto type = c10::CppTypeToScalarType<T>::value;
  TORCH_CHECK(q.scalar_type() == type && k.scalar_type() == type && v.scalar_type() == type,
              type == at::kFloat ? "float32 only" : "bfloat16 only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q [Hq, n, D], k and v [Hkv, S, D]");
  const int64_t hq = q.size(0), n = q.size(1), d = q.size(2), hkv = k.size(0), S = k.size(1);
  TORCH_CHECK(d == 64 || d == 128, "head dim 64 or 128");
  TORCH_CHECK(k.size(2) == d && v.size(2) == d && v.size(0) == hkv && v.size(1) == S, "k, v shapes");
  TORCH_CHECK(hq % hkv == 0 && n >= 1 && n <= S && (hq / hkv) * n <= kMaxRows, "heads / rows");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && k.stride(1) == d && v.stride(1) == d &&
              k.stride(0) == v.stride(0), "k and v rows must be contiguous, with equal head strides");
  TailMask tail{nullptr, static_cast<int>(n), static_cast<int>(n), S};
  at::Tensor bits;
  if (mask.has_value() && mask->defined()) {
    bits = mask->contiguous();
    TORCH_CHECK(bits.scalar_type() == at::kBool && bits.dim() == 2 && bits.size(0) == n && bits.size(1) >= n &&
                bits.size(1) <= S && bits.device().is_cpu(), "mask: bool [n, m] with n <= m <= S, on the CPU");
    tail = TailMask{bits.data_ptr<bool>(), static_cast<int>(n), static_cast<int>(bits.size(1)), S};
  }
  // [Hq, n, D] with the G query heads of each KV head adjacent: row (g, i) of head h is q[h*G + g, i].
  q = q.contiguous();
  auto out = at::empty_like(q);
  if (d == 64) flash_decode<64, T>(q, k, v, static_cast<float>(scale), tail, range64, out);
  else flash_decode<128, T>(q, k, v, static_cast<float>(scale), tail, range128, out);
  return out;
}

}  // namespace triforce_attention
