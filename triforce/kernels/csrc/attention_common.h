// What the AVX-512 decode-attention kernels share (attention_bf16.cpp, attention_amx.cpp); flash_decode.h
// holds what every level shares.
#pragma once
#include "aten.h"
#include <immintrin.h>

#include <cstdint>

#include "flash_decode.h"
#include "vec512.h"

namespace triforce_attention {

using triforce_vec::bf16_to_ps;
using triforce_vec::exp2_finite_softmax_ps;
using triforce_vec::exp2_softmax_ps;
using triforce_vec::exp_ps;
using triforce_vec::transpose16;

// Online-softmax state of each row over keys [begin, end) of one KV head, and the unnormalised output
// acc [R, D] (a RangeFn of flash_decode.h, which merges the ranges); keys a row does not see are skipped.
template <int D>
void attend_range_amx(const at::BFloat16* q, const at::BFloat16* k, const at::BFloat16* v, int64_t k_row,
                      int R, const TailMask& mask, int64_t begin, int64_t end, float scale, float* acc,
                      Partial* st);

}  // namespace triforce_attention
