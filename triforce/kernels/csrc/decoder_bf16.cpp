// The decoder layers of one bfloat16 forward (a decode step or a speculative check) as one call.
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

// x: [n, hidden]. weights: kWeightsPerLayer per layer. keys[l], values[l]: [Hkv, capacity, D] buffers
// that receive the n new rotated keys and values at offsets[l]. cos, sin: [n, D] of the new positions.
// last_query: [L, Hq, D], receives each layer's rotated query of the last new token. mask: the step's
// [n, m] over the last m keys (none for a chain), as decode_attention_bf16 takes it.
torch::Tensor decoder_layers_bf16(torch::Tensor x, const std::vector<torch::Tensor>& weights,
                                  const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                                  const std::vector<int64_t>& offsets, torch::Tensor cos, torch::Tensor sin,
                                  int64_t num_heads, int64_t num_kv_heads, double eps, double scale,
                                  bool linear_amx, torch::Tensor last_query,
                                  const std::optional<torch::Tensor>& mask) {
  const size_t layers = keys.size();
  TORCH_CHECK(weights.size() == layers * kWeightsPerLayer && values.size() == layers && offsets.size() == layers &&
                  last_query.size(0) == static_cast<int64_t>(layers),
              "one set of weights, buffers, offset and query row per layer");
  const int64_t n = x.size(0), d = last_query.size(2), hq = num_heads, hkv = num_kv_heads;
  for (size_t l = 0; l < layers; ++l) {
    const torch::Tensor* w = weights.data() + l * kWeightsPerLayer;
    auto qkv = linear_bf16(rms_norm_bf16(x, w[0], eps), w[1], false, linear_amx);
    if (w[2].numel() > 0) qkv = qkv + w[2];
    const auto heads = qkv.view({n, hq + 2 * hkv, d}).transpose(0, 1);  // [h, n, d]
    const auto q = rope_bf16(heads.narrow(0, 0, hq), cos, sin);
    const int64_t at = offsets[l];
    keys[l].narrow(1, at, n).copy_(rope_bf16(heads.narrow(0, hq, hkv), cos, sin));
    values[l].narrow(1, at, n).copy_(heads.narrow(0, hq + hkv, hkv));
    last_query[l].copy_(q.select(1, n - 1));
    const auto attn = decode_attention_bf16(q, keys[l].narrow(1, 0, at + n), values[l].narrow(1, 0, at + n), scale,
                                            true, mask);
    x = x + linear_bf16(attn.transpose(0, 1).reshape({n, hq * d}), w[3], false, linear_amx);
    const auto gate_up = linear_bf16(rms_norm_bf16(x, w[4], eps), w[5], false, linear_amx);
    x = x + linear_bf16(silu_mul_bf16(gate_up), w[6], false, linear_amx);
  }
  return x;
}
