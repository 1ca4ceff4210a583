// The decoder layers of one bfloat16 forward (a decode step or a speculative check, of one sequence or a
// batch) as one call.
//
// models/llama.py runs a layer as about 20 Python-side torch calls around the kernels; over 30 layers
// that overhead is several milliseconds per forward, as long as reading a tenth of the weights. This is
// the same loop in C++: DecoderLayer.forward with the cache's append inlined for caches that write the
// new rotated keys and values into a per-layer buffer at an offset and attend over the buffer up to
// the new tokens (KVCache.layer_buffers). It calls the same kernels with the same per-row arithmetic
// (attention of all sequences in one call, after each has written its keys and values), so its output is
// bit-identical to the Python loop's (tests/kernels).
#include "kernels.h"
#include <algorithm>  // std::min
#include <ATen/TensorOperators.h>  // x + y
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>

namespace {
// input norm, qkv, qkv bias (empty: none), o, post norm, gate_up, down, then the scales of qkv, o, gate_up
// and down where those are int8 (models/quantized.py; empty where bfloat16)
constexpr size_t kWeightsPerLayer = 11;

// kernels/linear.py's `linear`: the kernel up to kernel_rows rows in one call, and up to pieced_rows in
// pieces of kernel_rows (each row sums as its one-token step's does), torch's product (bias inside) past
// them (only where bfloat16 is native: the caller's choice); int8 weights (with their scales) take their
// kernel for any rows.
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& scale,
                   int64_t kernel_rows, int64_t pieced_rows) {
  const bool has_bias = bias.defined() && bias.numel() > 0;
  const bool int8 = scale.numel() > 0;
  const int64_t n = x.size(0);
  if (!int8 && n > pieced_rows) return has_bias ? at::linear(x, w, bias) : at::linear(x, w);
  at::Tensor out;
  if (int8) {
    out = linear_i8(x, w, scale, false);
  } else if (n <= kernel_rows) {
    out = linear_bf16(x, w, false, true);
  } else {
    std::vector<at::Tensor> pieces;
    for (int64_t r = 0; r < n; r += kernel_rows)
      pieces.push_back(linear_bf16(x.narrow(0, r, std::min(kernel_rows, n - r)), w, false, true));
    out = at::cat(pieces);
  }
  return has_bias ? out + bias : out;
}
}  // namespace

// x: [n, hidden], the rows of S sequences one after another (rows[s] each). weights: kWeightsPerLayer per
// layer. keys[s * L + l], values[s * L + l]: sequence s's [Hkv, capacity, D] buffers of layer l, which
// receive its new rotated keys and values at offsets[s * L + l]. cos, sin: [n, D] of the new positions.
// last_query[s]: [L, Hq, R, D], receives each layer's rotated queries of sequence s's last min(rows[s], R)
// new tokens (the cache's `last_query` picks the accepted one after a check). masks[s]:
// sequence s's [rows[s], m] over its last m keys (none for a chain), as decode_attention_bf16 takes it.
// The weights are read once per layer for all sequences; each sequence attends over its own buffers.
// Products of more than kernel_rows rows take the kernel in pieces up to pieced_rows, torch's path past
// them (only where bfloat16 is native: the caller's choice), as kernels/linear.py does.
at::Tensor decoder_layers_bf16(at::Tensor x, const std::vector<at::Tensor>& weights,
                               const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                               const std::vector<int64_t>& offsets, const std::vector<int64_t>& rows,
                               at::Tensor cos, at::Tensor sin, int64_t num_heads, int64_t num_kv_heads,
                               double eps, double scale, int64_t kernel_rows, int64_t pieced_rows,
                               const std::vector<at::Tensor>& last_query,
                               const std::vector<std::optional<at::Tensor>>& masks) {
  const size_t seqs = rows.size();
  TORCH_CHECK(seqs > 0 && last_query.size() == seqs && masks.size() == seqs, "one row count, query store and mask "
              "per sequence");
  const size_t layers = last_query[0].size(0);
  TORCH_CHECK(weights.size() == layers * kWeightsPerLayer && keys.size() == seqs * layers &&
                  values.size() == seqs * layers && offsets.size() == seqs * layers,
              "one set of weights per layer, and buffers and offset per sequence and layer");
  int64_t total = 0;
  for (const int64_t r : rows) total += r;
  TORCH_CHECK(total == x.size(0), "the row counts add up to x's rows");
  const int64_t n = x.size(0), d = last_query[0].size(3), hq = num_heads, hkv = num_kv_heads;
  std::vector<at::Tensor> qs(seqs), ks(seqs), vs(seqs);
  const at::Tensor no_bias;
  for (size_t l = 0; l < layers; ++l) {
    const at::Tensor* w = weights.data() + l * kWeightsPerLayer;
    const auto qkv = project(rms_norm_bf16(x, w[0], eps), w[1], w[2], w[7], kernel_rows, pieced_rows);
    const auto heads = qkv.view({n, hq + 2 * hkv, d}).transpose(0, 1);  // [h, n, d]
    int64_t row = 0;
    for (size_t s = 0; s < seqs; ++s) {
      const int64_t ns = rows[s], at = offsets[s * layers + l];
      const auto mine = heads.narrow(1, row, ns);
      const auto c = cos.narrow(0, row, ns), sn = sin.narrow(0, row, ns);
      const auto q = rope_bf16(mine.narrow(0, 0, hq), c, sn);
      const auto& k = keys[s * layers + l];
      const auto& v = values[s * layers + l];
      k.narrow(1, at, ns).copy_(rope_bf16(mine.narrow(0, hq, hkv), c, sn));
      v.narrow(1, at, ns).copy_(mine.narrow(0, hq + hkv, hkv));
      const int64_t kept = std::min<int64_t>(ns, last_query[s].size(2));  // the last rows' queries
      last_query[s][l].narrow(1, 0, kept).copy_(q.narrow(1, ns - kept, kept));
      qs[s] = q, ks[s] = k.narrow(1, 0, at + ns), vs[s] = v.narrow(1, 0, at + ns);
      row += ns;
    }
    const auto parts = decode_attention_batch_bf16(qs, ks, vs, scale, true, masks);  // every sequence's at once
    const auto attn = seqs == 1 ? parts[0] : at::cat(parts, 1);  // [hq, n, d]
    x = x + project(attn.transpose(0, 1).reshape({n, hq * d}), w[3], no_bias, w[8], kernel_rows, pieced_rows);
    const auto gate_up = project(rms_norm_bf16(x, w[4], eps), w[5], no_bias, w[9], kernel_rows, pieced_rows);
    x = x + project(silu_mul_bf16(gate_up), w[6], no_bias, w[10], kernel_rows, pieced_rows);
  }
  return x;
}
