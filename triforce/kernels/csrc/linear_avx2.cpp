// y[n, N] = x[n, K] . W[N, K]^T for bfloat16 x and W on AVX2 + FMA CPUs (no AVX512-BF16), n rows of x,
// 8 at a time.
//
// The `avx2` build's linear_bf16 (kernels/cpu.py). Weights stay bfloat16 in memory, half the bytes of
// float32, which is what a memory-bound decode step pays for; rows of W are widened to float32 in
// registers (a bfloat16 is the top half of a float32: shift left by 16), one at a time up to 4 rows of x
// and three at a time from 5, and multiplied into the activation rows, which were widened once, with
// FMA, a row's sums in one order whatever the count of rows (linear_avx2.h). Float32 accumulation, rounded once, like reference_linear; rows of W are split
// over torch's intra-op threads.
#include "kernels.h"  // what this file defines, declared as its callers see it

#include <vector>

#include "linear_avx2.h"

namespace {

template <typename Out>
void run(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  // The few activation rows, widened once here (a torch op would cost its dispatch on every call).
  std::vector<float> xf(static_cast<size_t>(x.numel()));
  const auto* xp = x.data_ptr<at::BFloat16>();
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = static_cast<float>(xp[i]);
  triforce_linear_avx2::run(static_cast<const float*>(xf.data()), static_cast<int>(x.size(0)),
                            w.data_ptr<at::BFloat16>(), y.data_ptr<Out>(), x.size(1), w.size(0));
}

}  // namespace

// float_out: float32 y, unrounded (logits). allow_amx: ignored (no tiles at this level).
at::Tensor linear_bf16(at::Tensor x, at::Tensor w, bool float_out, bool /*allow_amx*/) {
  auto y = triforce_linear::checked_output(x, w, float_out);
  if (float_out) run<float>(x, w, y);
  else run<at::BFloat16>(x, w, y);
  return y;
}
