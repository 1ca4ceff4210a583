// Decode attention for float32 q, K and V (--dtype float32: decode steps and speculative checks, what
// exactness runs use), in every build: the AVX2 + FMA range pass of attention_avx2.h under flash_decode.h's
// split and merge. torch's float32 paths (SDPA for a step, a masked or split pass for a check) sum a
// check's rows in other orders than a step's, so a check's logits differed from steps' in the last bits
// (benchmarks/check_rows.py --dtype float32); here a row sums in one order however many rows share it.
#include "kernels.h"  // what this file defines, declared as its callers see it

#include "attention_avx2.h"

at::Tensor decode_attention_f32(at::Tensor q, at::Tensor k, at::Tensor v, double scale,
                                const std::optional<at::Tensor>& mask) {
  using triforce_attention_avx2::attend_range;
  return triforce_attention::decode_attention_batch<float>({q}, {k}, {v}, scale, {mask}, attend_range<64, float>,
                                                           attend_range<128, float>)[0];
}
