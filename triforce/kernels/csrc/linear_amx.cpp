// y[n, N] = x[n, K] . W[N, K]^T with AMX-BF16 tiles, for n rows of x, 16 at a time, and N a multiple of 16.
//
// The vector kernel (linear_bf16.cpp) issues one dot product per row of x for every 64 bytes of W, so
// its read rate fell from 13.9 GB/s at 1 row to 7.6 at 7 (benchmarks/linear_bandwidth.py): a 7-token
// check read the weights at half speed. Here y^T = W . x^T: 16 rows of W load straight from memory as
// an A tile, x^T is packed once per call into B tiles (bf16 pairs of x's columns), and one tile
// instruction does 16 outputs x 16 rows of x, so up to 16 rows cost what one does. A row's sums do not
// depend on the other rows, so kernels/linear.py takes this path for steps of one row too (a check then
// rounds each token as a step does). Each block of 16 rows of W (contiguous) is walked 64 bytes of each row
// at a time, so the next block is prefetched 1 KB a step: the hardware's stream prefetch does not follow
// 16 interleaved rows (three blocks at once, sharing each B tile, read 1 and 2 rows of x at 0.7-0.9x the
// vector kernel's rate; this reads them at its rate or above: benchmarks/linear_bandwidth.py).
#include "aten.h"

#include "amx.h"

#include <algorithm>
#include <vector>

namespace triforce_linear {

// xt: B tiles [K / 32][16 pairs][16 rows of x]. Output blocks [b_begin, b_end) of 16 rows of W.
template <typename Out>
void blocks_amx(const int32_t* xt, const at::BFloat16* w, Out* y, int n, int64_t K, int64_t N,
                int64_t b_begin, int64_t b_end) {
  triforce_amx::configure_tiles();  // tiles: 0 = C, 3 = A (a block of W), 6 = B
  const int64_t steps = K / 32, stride = K * static_cast<int64_t>(sizeof(at::BFloat16));
  alignas(64) float c[16][16];
  auto write = [&](int64_t block, const float (*cb)[16]) {
    for (int t = 0; t < n; ++t)
      for (int r = 0; r < 16; ++r) y[t * N + block * 16 + r] = Out(cb[r][t]);
  };
  for (int64_t b = b_begin; b < b_end; ++b) {
    _tile_zero(0);
    const char* next = reinterpret_cast<const char*>(w + (b + 1) * 16 * K);  // the next block, 1 KB a step
    for (int64_t s = 0; s < steps; ++s) {
      if (b + 1 < b_end)
        for (int l = 0; l < 16; ++l) _mm_prefetch(next + (s * 16 + l) * 64, _MM_HINT_T1);
      _tile_loadd(6, xt + s * 256, 64);
      _tile_loadd(3, w + b * 16 * K + s * 32, stride);
      _tile_dpbf16ps(0, 3, 6);
    }
    _tile_stored(0, c, 64);
    write(b, c);
  }
  _tile_release();
}

template <typename Out>
void run_amx(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  const int n = static_cast<int>(x.size(0));
  const int64_t K = x.size(1), N = w.size(0);
  const auto* x32 = reinterpret_cast<const int32_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = w.data_ptr<at::BFloat16>();
  // Grain: at least ~256 KB of W per task, so small matrices are not split into tiny pieces.
  const int64_t grain = std::max<int64_t>(1, (256 * 1024) / (16 * K * 2));
  // The B tiles, packed once per piece of 16 rows of x. Columns past a piece's rows are left as they
  // are: a column of B reaches only its own column of C, which `write` never reads.
  thread_local std::vector<int32_t> packed;
  packed.resize(std::max(packed.size(), static_cast<size_t>(K / 32) * 256));
  int32_t* xt = packed.data();  // (the tasks below run on other threads, each with its own `packed`)
  for (int r0 = 0; r0 < n; r0 += 16) {  // pieces of 16 rows of x (one B tile's width)
    const int rows = std::min(16, n - r0);
    for (int t = 0; t < rows; ++t)
      for (int64_t p = 0; p < K / 2; ++p) xt[(p / 16) * 256 + (p % 16) * 16 + t] = x32[(r0 + t) * K / 2 + p];
    auto* yp = y.data_ptr<Out>() + r0 * N;
    at::parallel_for(0, N / 16, grain,
                     [&](int64_t b, int64_t e) { blocks_amx<Out>(xt, wp, yp, rows, K, N, b, e); });
  }
}

template void run_amx<float>(const at::Tensor&, const at::Tensor&, at::Tensor&);
template void run_amx<at::BFloat16>(const at::Tensor&, const at::Tensor&, at::Tensor&);

}  // namespace triforce_linear
