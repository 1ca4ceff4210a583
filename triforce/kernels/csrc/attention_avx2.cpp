// Decode attention for bfloat16 K/V on AVX2 + FMA CPUs (the `avx2` build of kernels/cpu.py): the range pass
// of attention_avx2.h under flash_decode.h's split and merge.
#include "kernels.h"  // what this file defines, declared as its callers see it

#include "attention_avx2.h"

at::Tensor decode_attention_bf16(at::Tensor q, at::Tensor k, at::Tensor v, double scale,
                                 bool /*allow_amx*/, const std::optional<at::Tensor>& mask) {
  using triforce_attention_avx2::attend_range;
  return triforce_attention::decode_attention<at::BFloat16>(q, k, v, scale, mask, attend_range<64, at::BFloat16>,
                                                            attend_range<128, at::BFloat16>);
}
