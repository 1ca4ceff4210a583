// y[n, N] = x[n, K] . W[N, K]^T with AMX-BF16 tiles, for n rows of x, 16 at a time (up to four such pieces
// per pass over W), and N a multiple of 16.
//
// The vector kernel (linear_bf16.cpp) issues one dot product per row of x for every 64 bytes of W, so
// its read rate fell from 13.9 GB/s at 1 row to 7.6 at 7 (benchmarks/linear_bandwidth.py): a 7-token
// check read the weights at half speed. Here y^T = W . x^T: 16 rows of W load straight from memory as
// an A tile, x^T is packed once per pass (up to 64 rows) into B tiles (bf16 pairs of x's columns), and one tile
// instruction does 16 outputs x 16 rows of x, so up to 16 rows cost what one does. A row's sums do not
// depend on the other rows, so kernels/linear.py takes this path for steps of one row too (a check then
// rounds each token as a step does). Each block of 16 rows of W (contiguous) is walked 64 bytes of each row
// at a time, so the next block is prefetched 1 KB a step: the hardware's stream prefetch does not follow
// 16 interleaved rows (three blocks at once, sharing each B tile, read 1 and 2 rows of x at 0.7-0.9x the
// vector kernel's rate; this reads them at its rate or above: benchmarks/linear_bandwidth.py). A pass
// over W took one piece and W came from memory once per 16 rows of x, so torch's product caught up by 64
// rows (the kernel 0.91-1.03x its time at 64, 1.08-1.28x at 96-128); each A tile now serves up to four
// pieces (0.70-0.84x at 64). Up to six had served 96 rows in one pass, but five and six pieces ran no faster
// than two passes of three (a batch of 8's 88-row check: two threads barely beat one), so n rows past 64
// take the fewest passes of at most four pieces, balanced: 88 rows as two passes of three pieces took
// 0.71x the time of one of six, 128 rows as 4 + 4 0.75x 6 + 2 (`python benchmarks/kernel_ab.py --kernel
// linear --new 64 65 80 88 96 128`, the 2-core AMX Xeon; 65-80 rows level with one pass of five).
#include "aten.h"

#include "amx.h"
#include "vec512.h"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace triforce_linear {

constexpr int kPiecesPerPass = 4;  // pieces of 16 rows of x per pass over W at most: C tiles 0..3, A = 6, B = 7

// The tile instructions take their tile numbers as literals, so piece i's work is spelled out per i.
#define TRIFORCE_PIECE_ZERO(i) if constexpr (P > i) _tile_zero(i);
#define TRIFORCE_PIECE_DOT(i)                          \
  if constexpr (P > i) {                               \
    _tile_loadd(7, xt + i * piece + s * 256, 64);      \
    _tile_dpbf16ps(i, 6, 7);                           \
  }
#define TRIFORCE_PIECE_STORE(i) if constexpr (P > i) _tile_stored(i, c[i], 64);
#define TRIFORCE_PIECES(op) op(0) op(1) op(2) op(3)

// 16 floats to bfloat16 as c10::BFloat16 rounds one (to nearest even; NaN to 0x7FC0), so the vector
// store writes what a scalar one did.
inline __m256i round_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                        _mm512_set1_epi32(0x7FFF));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0)));
}

// Rows 0 .. rows - 1 (up to 16) of y's columns [col, col + 16) from a C tile c[r][t] (r: the column,
// t: the row): transposed in registers, a row's 16 outputs in one store.
template <typename Out>
inline void store_piece(const float (*c)[16], Out* y, int64_t N, int64_t col, int rows) {
  __m512i v[16];
  for (int r = 0; r < 16; ++r) v[r] = _mm512_load_si512(c[r]);
  triforce_vec::transpose16(v);
  for (int t = 0; t < rows; ++t) {
    if constexpr (std::is_same_v<Out, float>)
      _mm512_storeu_ps(y + t * N + col, _mm512_castsi512_ps(v[t]));
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + t * N + col), round_bf16(_mm512_castsi512_ps(v[t])));
  }
}

// Blocks [b_begin, b_end) of 16 rows of W times P pieces of x (n rows in all, at most 16 P): xt holds
// each piece's B tiles ([K / 32][16 pairs][16 rows of x]), `piece` int32s apart. Every A tile (a block's
// 32 columns of 16 rows of W) serves all P pieces, so W comes from memory once for up to 64 rows of x.
// bfloat16 W loads as the A tile straight from memory; int8 W (a proposing tier's: linear_i8.cpp) is
// widened to bfloat16 (exact) into a scratch A tile first, its scale applied by the caller.
template <int P, typename Out, typename Wt>
void blocks_amx(const int32_t* xt, int64_t piece, const Wt* w, Out* y, int n, int64_t K, int64_t N,
                int64_t b_begin, int64_t b_end) {
  static_assert(P >= 1 && P <= kPiecesPerPass);
  static_assert(std::is_same_v<Wt, at::BFloat16> || std::is_same_v<Wt, int8_t>);
  constexpr int kLinesPerStep = 8 * static_cast<int>(sizeof(Wt));  // 16 rows x 32 columns of W, in cache lines
  triforce_amx::configure_tiles();
  const int64_t steps = K / 32, stride = K * static_cast<int64_t>(sizeof(Wt));
  alignas(64) float c[P][16][16];
  // int8 W: A tiles widened a step ahead, two in turn, so that a tile load does not wait on the stores
  // just made to it (widening the step's own tile before its load took 1.02-1.08x the time at 1, 2 and 8
  // rows of x: kernel_ab --kernel linear --dtype int8, the AMX Xeon)
  alignas(64) __m512bh widened[2][16];
  const auto widen = [&](int64_t b, int64_t s) {
    if constexpr (std::is_same_v<Wt, int8_t>)
      for (int r = 0; r < 16; ++r) widened[s & 1][r] = triforce_vec::int8_to_bf16(w + (b * 16 + r) * K + s * 32);
  };
  for (int64_t b = b_begin; b < b_end; ++b) {
    TRIFORCE_PIECES(TRIFORCE_PIECE_ZERO)
    const char* next = reinterpret_cast<const char*>(w + (b + 1) * 16 * K);  // the next block, a step's worth a step
    widen(b, 0);
    for (int64_t s = 0; s < steps; ++s) {
      if (b + 1 < b_end)
        for (int l = 0; l < kLinesPerStep; ++l) _mm_prefetch(next + (s * kLinesPerStep + l) * 64, _MM_HINT_T1);
      if constexpr (std::is_same_v<Wt, int8_t>) {
        _tile_loadd(6, widened[s & 1], 64);
        if (s + 1 < steps) widen(b, s + 1);
      } else {
        _tile_loadd(6, w + b * 16 * K + s * 32, stride);
      }
      TRIFORCE_PIECES(TRIFORCE_PIECE_DOT)
    }
    TRIFORCE_PIECES(TRIFORCE_PIECE_STORE)
    for (int i = 0; i < P; ++i) store_piece(c[i], y + 16 * i * N, N, b * 16, std::min(16, n - 16 * i));
  }
  _tile_release();
}

#undef TRIFORCE_PIECES
#undef TRIFORCE_PIECE_STORE
#undef TRIFORCE_PIECE_DOT
#undef TRIFORCE_PIECE_ZERO

// y = x . W^T for W [N, K] at wp (bfloat16 or int8).
template <typename Out, typename Wt>
void run_amx_on(const at::Tensor& x, const Wt* wp, int64_t N, at::Tensor& y) {
  const int n = static_cast<int>(x.size(0));
  const int64_t K = x.size(1), piece = (K / 32) * 256;
  const auto* x32 = reinterpret_cast<const int32_t*>(x.data_ptr<at::BFloat16>());
  // Grain: at least ~256 KB of W per task, so small matrices are not split into tiny pieces.
  const int64_t grain = std::max<int64_t>(1, (256 * 1024) / (16 * K * static_cast<int64_t>(sizeof(Wt))));
  // The B tiles of up to four pieces at a time (row t of x: piece t / 16, column t % 16), packed once per
  // pass, 16 x 16 int32s at a time transposed in registers (element by element, packing took a 40-row
  // call a tenth of its time, on one thread). Columns past the last piece's rows are zeros: a column of B
  // reaches only its own column of C, which blocks_amx never stores. The tasks read the caller's buffer (a
  // thread_local, kept for the next call: at most four pieces of K / 32 KB).
  const int pieces = (n + 15) / 16;
  thread_local std::vector<int32_t> packed;
  packed.resize(std::max(packed.size(), static_cast<size_t>(std::min(pieces, kPiecesPerPass) * piece)));
  int32_t* xp = packed.data();
  const int passes = (pieces + kPiecesPerPass - 1) / kPiecesPerPass, per_pass = (pieces + passes - 1) / passes;
  for (int first = 0; first < pieces; first += per_pass) {
    const int count = std::min(per_pass, pieces - first), rows = std::min(16 * count, n - 16 * first);
    const auto* xr = x32 + 16 * first * K / 2;  // the group's first row
    for (int i = 0; i < count; ++i)  // 16 rows x 16 pairs at a time, transposed in registers
      for (int64_t g = 0; g < K / 32; ++g) {
        __m512i v[16];
        for (int t = 0; t < 16; ++t)
          v[t] = 16 * i + t < rows ? _mm512_loadu_si512(xr + (16 * i + t) * K / 2 + 16 * g) : _mm512_setzero_si512();
        triforce_vec::transpose16(v);
        for (int p = 0; p < 16; ++p) _mm512_storeu_si512(xp + i * piece + g * 256 + p * 16, v[p]);
      }
    auto* yp = y.data_ptr<Out>() + 16 * first * N;
    at::parallel_for(0, N / 16, grain, [&](int64_t b, int64_t e) {
      switch (count) {
        case 1: return blocks_amx<1, Out, Wt>(xp, piece, wp, yp, rows, K, N, b, e);
        case 2: return blocks_amx<2, Out, Wt>(xp, piece, wp, yp, rows, K, N, b, e);
        case 3: return blocks_amx<3, Out, Wt>(xp, piece, wp, yp, rows, K, N, b, e);
        default: return blocks_amx<4, Out, Wt>(xp, piece, wp, yp, rows, K, N, b, e);
      }
    });
  }
}

template <typename Out>
void run_amx(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  run_amx_on<Out>(x, w.data_ptr<at::BFloat16>(), w.size(0), y);
}

template void run_amx<float>(const at::Tensor&, const at::Tensor&, at::Tensor&);
template void run_amx<at::BFloat16>(const at::Tensor&, const at::Tensor&, at::Tensor&);

// int8 Q [N, K] (N a multiple of 16), unscaled float32 sums into y [n, N].
void run_amx_i8(const at::Tensor& x, const at::Tensor& q, at::Tensor& y) {
  run_amx_on<float>(x, q.data_ptr<int8_t>(), q.size(0), y);
}

}  // namespace triforce_linear
