// The decoder layers of one bfloat16 forward (a decode step or a speculative check, of one sequence or a
// batch) as one call.
//
// models/llama.py runs a layer as about 20 Python-side torch calls around the kernels; over 30 layers
// that overhead is several milliseconds per forward, as long as reading a tenth of the weights. This is
// the same loop in C++: DecoderLayer.forward with the cache's append inlined for caches that write the
// new rotated keys and values into a per-layer buffer at an offset and attend over the buffer up to
// the new tokens (KVCache.layer_buffers). It calls the same kernels with the same arguments and torch
// ops in the same order, so its output is bit-identical to the Python loop's (tests/kernels).
#include <torch/extension.h>

#include <optional>
#include <vector>

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w, bool float_out, bool allow_amx);
torch::Tensor decode_attention_bf16(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale, bool allow_amx,
                                    const std::optional<torch::Tensor>& mask);
torch::Tensor rms_norm_bf16(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor silu_mul_bf16(torch::Tensor gate_up);
torch::Tensor rope_bf16(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);

namespace {
constexpr size_t kWeightsPerLayer = 7;  // input norm, qkv, qkv bias (empty: none), o, post norm, gate_up, down
}

// x: [n, hidden], the rows of S sequences one after another (rows[s] each). weights: kWeightsPerLayer per
// layer. keys[s * L + l], values[s * L + l]: sequence s's [Hkv, capacity, D] buffers of layer l, which
// receive its new rotated keys and values at offsets[s * L + l]. cos, sin: [n, D] of the new positions.
// last_query[s]: [L, Hq, D], receives each layer's rotated query of sequence s's last new token. masks[s]:
// sequence s's [rows[s], m] over its last m keys (none for a chain), as decode_attention_bf16 takes it.
// The weights are read once per layer for all sequences; each sequence attends over its own buffers.
torch::Tensor decoder_layers_bf16(torch::Tensor x, const std::vector<torch::Tensor>& weights,
                                  const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                                  const std::vector<int64_t>& offsets, const std::vector<int64_t>& rows,
                                  torch::Tensor cos, torch::Tensor sin, int64_t num_heads, int64_t num_kv_heads,
                                  double eps, double scale, bool linear_amx,
                                  const std::vector<torch::Tensor>& last_query,
                                  const std::vector<std::optional<torch::Tensor>>& masks) {
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
  const int64_t n = x.size(0), d = last_query[0].size(2), hq = num_heads, hkv = num_kv_heads;
  std::vector<torch::Tensor> parts(seqs);
  for (size_t l = 0; l < layers; ++l) {
    const torch::Tensor* w = weights.data() + l * kWeightsPerLayer;
    auto qkv = linear_bf16(rms_norm_bf16(x, w[0], eps), w[1], false, linear_amx);
    if (w[2].numel() > 0) qkv = qkv + w[2];
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
      last_query[s][l].copy_(q.select(1, ns - 1));
      parts[s] = decode_attention_bf16(q, k.narrow(1, 0, at + ns), v.narrow(1, 0, at + ns), scale, true, masks[s]);
      row += ns;
    }
    const auto attn = seqs == 1 ? parts[0] : torch::cat(parts, 1);  // [hq, n, d]
    x = x + linear_bf16(attn.transpose(0, 1).reshape({n, hq * d}), w[3], false, linear_amx);
    const auto gate_up = linear_bf16(rms_norm_bf16(x, w[4], eps), w[5], false, linear_amx);
    x = x + linear_bf16(silu_mul_bf16(gate_up), w[6], false, linear_amx);
  }
  return x;
}
