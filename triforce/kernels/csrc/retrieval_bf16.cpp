// A retrieval cache's build (kernels/retrieval.py), two steps of it in one call each:
// - chunk_means_bf16: the mean key of each chunk (chunk_mean_keys), bit for bit as its torch loop computes
//   it: a chunk's keys summed in float32 one position after another, the sum divided by the chunk size and
//   rounded to bfloat16 (to nearest, ties to even). The torch loop passes over the whole float32 sum once
//   per position of a chunk; this reads each chunk once (1 KB of keys: chunk 8, head dim 64). SmolLM2's
//   8K prompt: 31 ms of means per sequence in a request, 6-8 ms here (docs/speed.md).
// - copy_chunks: the chosen chunks copied into the cache's buffers (refill_chunks), one memcpy per chunk.
// Plain C++ that the compiler vectorises at each level's flags.
#include "kernels.h"  // what this file defines, declared as its callers see it

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {
inline float widen(uint16_t bits) {  // bfloat16 -> float32: the same bits in the high half
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

inline uint16_t narrow(float x) {  // float32 -> bfloat16, to nearest even as c10::BFloat16 rounds; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const auto rounded = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  return x != x ? static_cast<uint16_t>(0x7FC0) : rounded;  // (a select, not a branch: the loop vectorises)
}
}  // namespace

// keys [R, S, D] bfloat16, each row's [S, D] contiguous (rows may be apart: a cache's first S of its capacity)
// -> [R, S / chunk_size, D].
at::Tensor chunk_means_bf16(at::Tensor keys, int64_t chunk_size) {
  TORCH_CHECK(keys.scalar_type() == at::kBFloat16 && keys.dim() == 3, "chunk_means_bf16: bfloat16 keys [R, S, D]");
  TORCH_CHECK(keys.stride(2) == 1 && keys.stride(1) == keys.size(2), "chunk_means_bf16: each row's [S, D] contiguous");
  TORCH_CHECK(chunk_size > 0 && keys.size(1) % chunk_size == 0, "chunk_means_bf16: S a multiple of the chunk size");
  const int64_t rows = keys.size(0), chunks = keys.size(1) / chunk_size, d = keys.size(2), row_stride = keys.stride(0);
  auto out = at::empty({rows, chunks, d}, keys.options());
  const auto* in = reinterpret_cast<const uint16_t*>(keys.data_ptr<at::BFloat16>());
  auto* means = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float n = static_cast<float>(chunk_size);
  at::parallel_for(0, rows * chunks, 256, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(d);
    float* sum = sums.data();
    for (int64_t i = begin; i < end; ++i) {
      const uint16_t* chunk = in + (i / chunks) * row_stride + (i % chunks) * chunk_size * d;
      for (int64_t e = 0; e < d; ++e) sum[e] = widen(chunk[e]);
      for (int64_t p = 1; p < chunk_size; ++p) {
        const uint16_t* key = chunk + p * d;
        for (int64_t e = 0; e < d; ++e) sum[e] += widen(key[e]);
      }
      uint16_t* mean = means + i * d;
      for (int64_t e = 0; e < d; ++e) mean[e] = narrow(sum[e] / n);
    }
  });
  return out;
}

// dst[rows[i], slots[i] * c : (slots[i] + 1) * c] = src[rows[i], chunks[i] * c : (chunks[i] + 1) * c] for each i,
// c = chunk_size; dst [R, cap, D] and src [R, S, D] of one dtype, each row's [., D] contiguous (refill_chunks
// took 20-35 ms of a first build at 8K in index_select / index_copy_ and their index tensors of every row).
void copy_chunks(at::Tensor dst, at::Tensor src, at::Tensor rows, at::Tensor slots, at::Tensor chunks,
                 int64_t chunk_size) {
  TORCH_CHECK(dst.dim() == 3 && src.dim() == 3 && dst.scalar_type() == src.scalar_type() && dst.size(0) == src.size(0)
              && dst.size(2) == src.size(2), "copy_chunks: dst [R, cap, D] and src [R, S, D] of one dtype");
  TORCH_CHECK(dst.stride(2) == 1 && dst.stride(1) == dst.size(2) && src.stride(2) == 1 && src.stride(1) == src.size(2),
              "copy_chunks: each row's [., D] contiguous");
  for (const auto& ids : {rows, slots, chunks})
    TORCH_CHECK(ids.scalar_type() == at::kLong && ids.is_contiguous() && ids.numel() == rows.numel(),
                "copy_chunks: rows, slots and chunks as int64 [m]");
  const int64_t m = rows.numel(), width = chunk_size * dst.size(2) * dst.element_size();
  const int64_t* row = rows.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t* chunk = chunks.data_ptr<int64_t>();
  for (int64_t i = 0; i < m; ++i)  // (every copy inside both buffers: an index out of range fails, never writes)
    TORCH_CHECK(row[i] >= 0 && row[i] < dst.size(0) && slot[i] >= 0 && (slot[i] + 1) * chunk_size <= dst.size(1)
                && chunk[i] >= 0 && (chunk[i] + 1) * chunk_size <= src.size(1), "copy_chunks: a chunk out of range");
  auto* out = static_cast<char*>(dst.data_ptr());
  const auto* in = static_cast<const char*>(src.data_ptr());
  const int64_t out_row = dst.stride(0) * dst.element_size(), in_row = src.stride(0) * src.element_size();
  at::parallel_for(0, m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(out + row[i] * out_row + slot[i] * width, in + row[i] * in_row + chunk[i] * width, width);
  });
}
