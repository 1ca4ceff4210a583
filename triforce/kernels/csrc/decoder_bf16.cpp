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
#include <algorithm>  // std::min, std::copy_n
#include <ATen/TensorOperators.h>  // x + y
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>

using bf16 = at::BFloat16;

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
  TORCH_CHECK(cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16 && cos.size(0) == n &&
              cos.size(1) == d && sin.sizes() == cos.sizes(), "cos and sin: bfloat16 [n, head dim]");
  cos = cos.contiguous(), sin = sin.contiguous();
  for (size_t i = 0; i < keys.size(); ++i)
    TORCH_CHECK(keys[i].stride(2) == 1 && values[i].stride(2) == 1 && keys[i].size(0) == hkv &&
                values[i].size(0) == hkv && keys[i].size(2) == d && values[i].size(2) == d &&
                offsets[i] + rows[i / layers] <= std::min(keys[i].size(1), values[i].size(1)),
                "KV buffers [Hkv, capacity, D] with contiguous rows, room for the new tokens at their offsets");
  // Each sequence's rotated queries [hq, n_s, d], rewritten every layer; its rotated keys and its values go
  // straight into its buffers at their offsets, its last queries into its query store (raw rows, not
  // torch's narrow, copy_ and rope calls: eight a sequence a layer, their dispatch the cost of a batch's
  // streaming draft step)
  std::vector<at::Tensor> qs(seqs), ks(seqs), vs(seqs);
  for (size_t s = 0; s < seqs; ++s) qs[s] = at::empty({hq, rows[s], d}, x.options());
  const at::Tensor no_bias;
  const int64_t heads_row = (hq + 2 * hkv) * d;  // one token's q, k and v: qkv [n, heads_row]
  for (size_t l = 0; l < layers; ++l) {
    const at::Tensor* w = weights.data() + l * kWeightsPerLayer;
    const auto qkv =
        project(rms_norm_bf16(x, w[0], eps), w[1], w[2], w[7], kernel_rows, pieced_rows).contiguous();
    const bf16* heads = qkv.data_ptr<bf16>();  // head h of token t at heads + t * heads_row + h * d
    int64_t row = 0;
    for (size_t s = 0; s < seqs; ++s) {
      const int64_t ns = rows[s], at = offsets[s * layers + l];
      const bf16* mine = heads + row * heads_row;
      const bf16 *c = cos.data_ptr<bf16>() + row * d, *sn = sin.data_ptr<bf16>() + row * d;
      const auto& k = keys[s * layers + l];
      const auto& v = values[s * layers + l];
      bf16* q = qs[s].data_ptr<bf16>();
      rope_into(mine, d, heads_row, c, sn, hq, ns, d, q, ns * d, d);
      rope_into(mine + hq * d, d, heads_row, c, sn, hkv, ns, d, k.data_ptr<bf16>() + at * k.stride(1), k.stride(0),
                k.stride(1));
      bf16* vp = v.data_ptr<bf16>() + at * v.stride(1);
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t t = 0; t < ns; ++t)
          std::copy_n(mine + t * heads_row + (hq + hkv + h) * d, d, vp + h * v.stride(0) + t * v.stride(1));
      const auto store = last_query[s][l];  // [hq, R, d]: the last rows' queries
      const int64_t kept = std::min<int64_t>(ns, store.size(1));
      TORCH_CHECK(store.scalar_type() == at::kBFloat16 && store.stride(2) == 1, "query stores: bfloat16 rows");
      bf16* sp = store.data_ptr<bf16>();
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t t = 0; t < kept; ++t)
          std::copy_n(q + (h * ns + ns - kept + t) * d, d, sp + h * store.stride(0) + t * store.stride(1));
      ks[s] = k.narrow(1, 0, at + ns), vs[s] = v.narrow(1, 0, at + ns);
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
