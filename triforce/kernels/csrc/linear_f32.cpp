// y[n, N] = x[n, K] . W[N, K]^T for float32 x and W, n rows of x, 8 at a time: float32 decode steps and
// checks (--dtype float32, what exactness runs use), in every build (AVX2 + FMA, linear_avx2.h).
//
// torch's float32 product of a few rows read the weights at half the memory bandwidth at one row of x
// and slower at two than at four (benchmarks/float32_rows.py: 11.2, 27.4 and 19.3 ms for SmolLM2's
// 113 MB head at 1, 2 and 4 rows on the 2-core Zen 4), so a float32 forward of 2 tokens cost 1.7x one
// of 1 and speculation could not pay in float32. A row's sums run in one order whatever the count of
// rows (as linear_avx2.h says).
#include "kernels.h"  // what this file defines, declared as its callers see it

#include "linear_avx2.h"

at::Tensor linear_f32(at::Tensor x, at::Tensor w) {
  auto y = triforce_linear::checked_output(x, w, /*float_out=*/true, at::kFloat, /*k_step=*/16);
  triforce_linear_avx2::run(x.data_ptr<float>(), static_cast<int>(x.size(0)), w.data_ptr<float>(),
                            y.data_ptr<float>(), x.size(1), w.size(0));
  return y;
}
