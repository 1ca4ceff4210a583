// The entry points of the CPU kernels, declared once: bindings.cpp exports them to Python, decoder_bf16.cpp's
// layer loop calls them, and each level's sources (kernels/cpu.py's BUILDS) define them against this.
#pragma once
#include "aten.h"

#include <optional>
#include <vector>

at::Tensor linear_bf16(at::Tensor x, at::Tensor w, bool float_out, bool allow_amx);
at::Tensor linear_f32(at::Tensor x, at::Tensor w);
at::Tensor linear_i8(at::Tensor x, at::Tensor q, at::Tensor scale, bool float_out);
// Decode attention of several sequences (one model's) in one pass: the threads share them all. Each
// level's attention source defines it (flash_decode.h's decode_attention_batch with its range function).
std::vector<at::Tensor> decode_attention_batch_bf16(const std::vector<at::Tensor>& qs, const std::vector<at::Tensor>& ks,
                                                    const std::vector<at::Tensor>& vs, double scale, bool allow_amx,
                                                    const std::vector<std::optional<at::Tensor>>& masks);
// One sequence's: a batch of one.
inline at::Tensor decode_attention_bf16(at::Tensor q, at::Tensor k, at::Tensor v, double scale, bool allow_amx,
                                        const std::optional<at::Tensor>& mask) {
  return decode_attention_batch_bf16({q}, {k}, {v}, scale, allow_amx, {mask})[0];
}
at::Tensor decode_attention_f32(at::Tensor q, at::Tensor k, at::Tensor v, double scale,
                                const std::optional<at::Tensor>& mask);
at::Tensor rms_norm_bf16(at::Tensor x, at::Tensor weight, double eps);
at::Tensor silu_mul_bf16(at::Tensor gate_up);
at::Tensor rope_bf16(at::Tensor x, at::Tensor cos, at::Tensor sin);
void rope_into(const at::BFloat16* x, int64_t xh, int64_t xt, const at::BFloat16* cos, const at::BFloat16* sin,
               int64_t H, int64_t n, int64_t D, at::BFloat16* out, int64_t oh, int64_t ot);
at::Tensor chunk_means_bf16(at::Tensor keys, int64_t chunk_size);
void copy_chunks(at::Tensor dst, at::Tensor src, at::Tensor rows, at::Tensor slots, at::Tensor chunks,
                 int64_t chunk_size);
at::Tensor decoder_layers_bf16(at::Tensor x, const std::vector<at::Tensor>& weights,
                               const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                               const std::vector<int64_t>& offsets, const std::vector<int64_t>& rows,
                               at::Tensor cos, at::Tensor sin, int64_t num_heads, int64_t num_kv_heads,
                               double eps, double scale, int64_t kernel_rows, int64_t pieced_rows,
                               const std::vector<at::Tensor>& last_query,
                               const std::vector<std::optional<at::Tensor>>& masks);
