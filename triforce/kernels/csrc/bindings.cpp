// The CPU kernels of triforce as one torch extension (see triforce/kernels/cpu.py).
#include <torch/python.h>  // pybind11 and its tensor casters, without the rest of the C++ API (aten.h)

#include "amx.h"
#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_bf16", &linear_bf16, "bf16 x . W^T for a few rows of x", py::arg("x"), py::arg("w"),
        py::arg("float_out") = false, py::arg("allow_amx") = true);
  m.def("linear_f32", &linear_f32, "float32 x . W^T for a few rows of x", py::arg("x"), py::arg("w"));
  m.def("linear_i8", &linear_i8, "(x . Q^T) * scale for int8 weights Q with a float32 scale per row (a proposing tier's)",
        py::arg("x"), py::arg("q"), py::arg("scale"), py::arg("float_out") = false);
  m.def("decode_attention_bf16", &decode_attention_bf16,
        "bf16 attention of a few new queries, causal among them or under a mask [n, m] over the last m keys",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("allow_amx") = true,
        py::arg("mask") = py::none());
  m.def("decode_attention_batch_bf16", &decode_attention_batch_bf16,
        "decode_attention_bf16 of several sequences in one pass", py::arg("qs"), py::arg("ks"), py::arg("vs"),
        py::arg("scale"), py::arg("allow_amx"), py::arg("masks"));
  m.def("decode_attention_f32", &decode_attention_f32,
        "float32 attention of a few new queries, causal among them or under a mask [n, m] over the last m keys",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("mask") = py::none());
  m.def("amx_usable", &triforce_amx::usable, "AMX-BF16 tiles available to this process");
  m.def("rms_norm_bf16", &rms_norm_bf16, "bf16 RMSNorm with float32 statistics");
  m.def("silu_mul_bf16", &silu_mul_bf16, "silu(gate) * up of [gate | up]");
  m.def("rope_bf16", &rope_bf16, "rotary embedding of [H, n, D]");
  m.def("chunk_means_bf16", &chunk_means_bf16, "the mean key of each chunk of [R, S, D] bf16 keys (float32 sums)",
        py::arg("keys"), py::arg("chunk_size"));
  m.def("copy_chunks", &copy_chunks, "chunks of rows of src [R, S, D] into slots of dst [R, cap, D]", py::arg("dst"),
        py::arg("src"), py::arg("rows"), py::arg("slots"), py::arg("chunks"), py::arg("chunk_size"));
  m.def("decoder_layers_bf16", &decoder_layers_bf16,
        "the decoder layers of one forward of a batch of sequences over their per-layer KV buffers",
        py::arg("x"), py::arg("weights"), py::arg("keys"), py::arg("values"), py::arg("offsets"), py::arg("rows"),
        py::arg("cos"), py::arg("sin"), py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("eps"),
        py::arg("scale"), py::arg("kernel_rows"), py::arg("pieced_rows"), py::arg("last_query"), py::arg("masks"));
}
