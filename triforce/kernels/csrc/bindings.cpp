// The CPU kernels of triforce as one torch extension (see triforce/kernels/cpu.py).
#include <torch/extension.h>

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w);
torch::Tensor decode_attention_bf16(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_bf16", &linear_bf16, "bf16 x . W^T for n <= 8 rows");
  m.def("decode_attention_bf16", &decode_attention_bf16, "bf16 attention of n <= 16 new queries, causal tail");
}
