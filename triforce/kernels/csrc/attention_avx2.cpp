// Decode attention for bfloat16 K/V on AVX2 + FMA CPUs (the `avx2` build of kernels/cpu.py): the range pass
// of attention_avx2.h under flash_decode.h's split and merge.
#include "kernels.h"  // what this file defines, declared as its callers see it

#include "attention_avx2.h"

std::vector<at::Tensor> decode_attention_batch_bf16(const std::vector<at::Tensor>& qs, const std::vector<at::Tensor>& ks,
                                                    const std::vector<at::Tensor>& vs, double scale,
                                                    bool /*allow_amx*/, const std::vector<std::optional<at::Tensor>>& masks) {
  using triforce_attention_avx2::attend_range;
  return triforce_attention::decode_attention_batch<at::BFloat16>(qs, ks, vs, scale, masks,
                                                                  attend_range<64, at::BFloat16>,
                                                                  attend_range<128, at::BFloat16>);
}
