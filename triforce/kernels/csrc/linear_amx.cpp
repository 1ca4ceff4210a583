// y[n, N] = x[n, K] . W[N, K]^T with AMX-BF16 tiles, for n rows of x, 16 at a time, and N a multiple of 16.
//
// The vector kernel (linear_bf16.cpp) issues one dot product per row of x for every 64 bytes of W, so
// its read rate fell from 13.9 GB/s at 1 row to 7.6 at 7 (benchmarks/linear_bandwidth.py): a 7-token
// check read the weights at half speed. Here y^T = W . x^T: 16 rows of W load straight from memory as
// an A tile, x^T is packed once per call into B tiles (bf16 pairs of x's columns), and one tile
// instruction does 16 outputs x 16 rows of x, so up to 16 rows cost what one does.
#include "aten.h"

#include "amx.h"

#include <algorithm>
#include <vector>

namespace triforce_linear {

// xt: B tiles [K / 32][16 pairs][16 rows of x]. Output blocks [b_begin, b_end) of 16 rows of W.
template <typename Out>
void blocks_amx(const int32_t* xt, const at::BFloat16* w, Out* y, int n, int64_t K, int64_t N,
                int64_t b_begin, int64_t b_end) {
  triforce_amx::configure_tiles();  // tiles: 0..2 = C, 3..5 = A (three blocks of W), 6 = B
  const int64_t steps = K / 32, stride = K * static_cast<int64_t>(sizeof(at::BFloat16));
  alignas(64) float c[3][16][16];
  auto write = [&](int64_t block, const float (*cb)[16]) {
    for (int t = 0; t < n; ++t)
      for (int r = 0; r < 16; ++r) y[t * N + block * 16 + r] = Out(cb[r][t]);
  };
  int64_t b = b_begin;
  for (; b + 3 <= b_end; b += 3) {  // three blocks share each B tile load
    const at::BFloat16* w0 = w + b * 16 * K;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    for (int64_t s = 0; s < steps; ++s) {
      _tile_loadd(6, xt + s * 256, 64);
      _tile_loadd(3, w0 + s * 32, stride);
      _tile_dpbf16ps(0, 3, 6);
      _tile_loadd(4, w0 + 16 * K + s * 32, stride);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(5, w0 + 32 * K + s * 32, stride);
      _tile_dpbf16ps(2, 5, 6);
    }
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    _tile_stored(2, c[2], 64);
    for (int i = 0; i < 3; ++i) write(b + i, c[i]);
  }
  for (; b < b_end; ++b) {
    _tile_zero(0);
    for (int64_t s = 0; s < steps; ++s) {
      _tile_loadd(6, xt + s * 256, 64);
      _tile_loadd(3, w + b * 16 * K + s * 32, stride);
      _tile_dpbf16ps(0, 3, 6);
    }
    _tile_stored(0, c[0], 64);
    write(b, c[0]);
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
  for (int r0 = 0; r0 < n; r0 += 16) {  // pieces of 16 rows of x (one B tile's width)
    const int rows = std::min(16, n - r0);
    std::vector<int32_t> xt(static_cast<size_t>(K / 32) * 256, 0);
    for (int t = 0; t < rows; ++t)
      for (int64_t p = 0; p < K / 2; ++p) xt[(p / 16) * 256 + (p % 16) * 16 + t] = x32[(r0 + t) * K / 2 + p];
    auto* yp = y.data_ptr<Out>() + r0 * N;
    at::parallel_for(0, N / 16, grain,
                     [&](int64_t b, int64_t e) { blocks_amx<Out>(xt.data(), wp, yp, rows, K, N, b, e); });
  }
}

template void run_amx<float>(const at::Tensor&, const at::Tensor&, at::Tensor&);
template void run_amx<at::BFloat16>(const at::Tensor&, const at::Tensor&, at::Tensor&);

}  // namespace triforce_linear
