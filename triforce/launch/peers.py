"""What a Python user would run instead of triforce, timed the way triforce's own runs are.

- `transformers` plain `generate` on the same folder and dtype;
- `transformers` assisted generation (`assistant_model`) with the same draft. A reduced-vocabulary draft
  is widened to the target's vocabulary for it (rows of tokens it lacks read as its shared "other"
  embedding and get logit -inf), so the assistant proposes exactly what our tier 1 proposes;
- llama.cpp through `llama-cpp-python`, on the same GGUF, when that package is importable (an optional
  extra; it is not installed in CI).

Each returns {"tokens_per_s", "prefill_s", "token_ids"}; decode speed excludes the prompt's prefill,
which is timed separately with a one-token generation, as in triforce's metrics.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..models.loader import DTYPES
from ..models.vocab import ReducedVocabulary


def _masked_lm_class():
    from transformers import LlamaForCausalLM

    class MaskedLlamaForCausalLM(LlamaForCausalLM):
        """A draft widened to its target's vocabulary; `impossible` tokens get logit -inf."""

        impossible: torch.Tensor | None = None

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            if self.impossible is not None:
                out.logits[..., self.impossible] = float("-inf")
            return out

    return MaskedLlamaForCausalLM


def widened_draft(draft_path: Path, dtype: torch.dtype):
    """The draft as a transformers model over the target's whole vocabulary."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(draft_path)
    vocab = ReducedVocabulary.from_folder(draft_path, config.vocab_size)
    if vocab is None:
        return AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype).eval()
    small = AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype)
    config.vocab_size, config.tie_word_embeddings = vocab.target_vocab_size, False
    wide = _masked_lm_class()(config).to(dtype)
    state = small.state_dict()
    table = state["model.embed_tokens.weight"][vocab.to_draft]  # unkept tokens -> the "other" row
    state["model.embed_tokens.weight"] = table
    state["lm_head.weight"] = table.clone() if "lm_head.weight" not in state else state["lm_head.weight"][vocab.to_draft]
    wide.load_state_dict(state)
    impossible = torch.ones(vocab.target_vocab_size, dtype=torch.bool)
    impossible[vocab.token_ids] = False
    wide.impossible = impossible
    return wide.eval()


class TransformersPeer:
    """transformers' generate on the device our runs use (it ran on the CPU beside a GPU run, which the
    speedups then divided by)."""

    def __init__(self, target_path: Path, dtype: str, draft_path: Path | None = None,
                 device: torch.device | str = "cpu"):
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(target_path, dtype=DTYPES[dtype]).eval().to(self.device)
        self.assistant = None if draft_path is None else widened_draft(draft_path, DTYPES[dtype]).to(self.device)
        # warm-up: the first generate pays one-time costs, which fell in the first run's prefill (its decode
        # time is the whole run's less a separate prefill's: shorter, and the peer faster than it was)
        self._generate(torch.zeros(1, 8, dtype=torch.long, device=self.device), 2, 0.0, 1.0, 0, False)

    def _generate(self, ids: torch.Tensor, new_tokens: int, temperature: float, top_p: float, seed: int,
                  assisted: bool) -> torch.Tensor:
        torch.manual_seed(seed)
        # repetition_penalty 1: not the folder's generation_config.json's (Qwen2.5's 1.1, applied even greedy),
        # which our runs do not take (bench builds its LLM with generation_config="vllm")
        kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=temperature > 0,
                      repetition_penalty=1.0)
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        if assisted:
            kwargs["assistant_model"] = self.assistant
        with torch.inference_mode():  # an explicit mask: transformers would otherwise hide pad-id tokens
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)[0, ids.shape[1]:]
        return out.cpu()  # (on a GPU: its work done, before the clock is read)

    def run(self, prompt: list[int], new_tokens: int, temperature: float, top_p: float, seed: int,
            assisted: bool = False) -> dict:
        if assisted and self.assistant is None:
            raise ValueError("assisted generation needs a draft")
        ids = torch.tensor([prompt], device=self.device)
        start = time.perf_counter()
        self._generate(ids, 1, temperature, top_p, seed, False)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = self._generate(ids, new_tokens, temperature, top_p, seed, assisted)
        total = time.perf_counter() - start
        return {"tokens_per_s": (len(out) - 1) / max(total - prefill, 1e-9), "prefill_s": prefill,
                "token_ids": out.tolist(), "device": str(self.device)}


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


class LlamaCppPeer:  # pragma: no cover - needs the optional llama-cpp-python
    """llama.cpp's own settings except two, both measured on this repository's CPU (llama-cpp-python
    0.3.36, SmolLM2 Q4_1): its extra weight buffers are off, because their AMX matrix path crashed
    (SIGSEGV in ggml_backend_amx_mul_mat) on the first decode; flash attention stays off, its default,
    which decoded 16.5 tokens/s at a 7.9K-token context against 5.8 with it on (development runs, not
    kept)."""

    def __init__(self, gguf: Path, context: int, threads: int | None = None):
        import llama_cpp.llama_cpp as lib
        from llama_cpp import Llama

        defaults = lib.llama_model_default_params

        def without_extra_buffers():
            params = defaults()
            params.use_extra_bufts = False
            return params

        lib.llama_model_default_params = without_extra_buffers  # Llama() reads its model settings here
        try:
            threads = threads or torch.get_num_threads()  # its prefill's too (by default: every logical CPU)
            self.llm = Llama(model_path=str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                             verbose=False)
        finally:
            lib.llama_model_default_params = defaults

    def run(self, prompt: list[int], new_tokens: int, temperature: float, top_p: float, seed: int) -> dict:
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(prompt)
        prefill = time.perf_counter() - start
        self.llm.set_seed(seed)
        out, start = [], time.perf_counter()
        for _ in range(new_tokens):
            # min_p 0 and top_k 0 switch off llama.cpp's default filters (min_p 0.05, top_k 40), so it
            # samples the distribution the other runs sample.
            token = self.llm.sample(temp=temperature, top_p=top_p if temperature > 0 else 1.0, top_k=0, min_p=0.0)
            out.append(int(token))
            self.llm.eval([token])
        return {"tokens_per_s": new_tokens / (time.perf_counter() - start), "prefill_s": prefill, "token_ids": out,
                "device": "cpu"}  # (its layers stay on the CPU: n_gpu_layers 0)
