// What the bfloat16 decode-attention kernels share (attention_bf16.cpp, attention_amx.cpp).
#pragma once
#include <torch/extension.h>
#include <immintrin.h>

#include <cstdint>

#include "vec512.h"

namespace triforce_attention {

constexpr int kMaxRows = 128;  // G * n: query rows that share one pass over a KV head

using triforce_vec::bf16_to_ps;
using triforce_vec::exp_ps;
using triforce_vec::transpose16;

struct Partial {  // one row's online-softmax state over a range of keys
  float max, sum;
};

// Online-softmax state of each row over keys [begin, end) of one KV head, and the unnormalised output
// acc [R, D]; run() in attention_bf16.cpp merges the ranges. Keys past S - n + (r % n) are masked.
template <int D>
void attend_range_amx(const at::BFloat16* q, const at::BFloat16* k, const at::BFloat16* v, int64_t k_row,
                      int R, int n, int64_t S, int64_t begin, int64_t end, float scale, float* acc, Partial* st);

}  // namespace triforce_attention
