// What the decode-linear kernels of every level share (linear_bf16.cpp for AVX512-BF16 and AMX,
// linear_avx2.cpp for AVX2): the argument checks of linear_bf16 and the split of W's rows over torch's
// intra-op threads. A level supplies the row function: rows [begin, end) of W against all rows of x.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>

namespace triforce_linear {

constexpr int kVectorMaxRows = 8;  // rows of x the vector paths take (kernels/linear.py: VECTOR_MAX_ROWS)

template <typename X, typename Out>
using RowsFn = void (*)(const X* x, const at::BFloat16* w, Out* y, int64_t K, int64_t N, int64_t begin, int64_t end);

// Rows of W over the threads, at least ~256 KB of W per task, so small matrices are not split into tiny pieces.
template <typename X, typename Out>
void parallel_rows(RowsFn<X, Out> rows, const X* x, const at::BFloat16* w, Out* y, int64_t K, int64_t N) {
  const int64_t grain = std::max<int64_t>(1, (256 * 1024) / (K * 2));
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) { rows(x, w, y, K, N, begin, end); });
}

// Checks linear_bf16's arguments (x [n, K] with 1 <= n <= max_rows, W [N, K] contiguous, both bfloat16,
// K a multiple of 32); makes x contiguous; returns y [n, N], float32 (unrounded: logits) or bfloat16.
inline torch::Tensor checked_output(torch::Tensor& x, const torch::Tensor& w, bool float_out, int64_t max_rows) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [n, K], w [N, K]");
  TORCH_CHECK(x.size(1) % 32 == 0, "K must be a multiple of 32");
  TORCH_CHECK(w.is_contiguous(), "w must be contiguous");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= max_rows, "1 to ", max_rows, " rows of x here (16 only with AMX and N % 16 == 0)");
  x = x.contiguous();
  return torch::empty({x.size(0), w.size(0)}, x.options().dtype(float_out ? at::kFloat : at::kBFloat16));
}

}  // namespace triforce_linear
