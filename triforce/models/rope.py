"""Rotary position embeddings with the scaling kinds that Hugging Face configs name.

The cos/sin table is computed once in float32 for every position the model supports and cast to the
activation dtype when applied, as transformers does, so logits agree to float32 rounding.
Layout is the Hugging Face one (rotate the two halves of the head), not the interleaved GGUF one.

`dynamic` (NTK) is computed once for the model's whole length, as vLLM does: transformers recomputes it
per forward from the longest position seen so far, so a 7-token check and a one-token step would rotate
the same position differently and speculation could not reproduce plain decoding. The two agree on a
forward that reaches the last position.
"""
from __future__ import annotations

import math

import torch

from ..kernels.fused import rope

from .config import ModelConfig


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_ctx / high) * ~(wavelen > old_ctx / low)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(cfg: ModelConfig, dim: int) -> tuple[torch.Tensor, float]:
    s, base = cfg.rope_scaling, cfg.rope_theta
    orig = s["original_max_position_embeddings"]
    factor = s.get("factor") or cfg.max_position_embeddings / orig

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _dynamic_ntk_theta(cfg: ModelConfig) -> float:
    """The NTK-scaled base for the model's whole length (transformers' formula at that sequence length)."""
    s, dim = cfg.rope_scaling, cfg.head_dim
    original = s.get("original_max_position_embeddings", cfg.max_position_embeddings)
    stretch = s["factor"] * cfg.max_position_embeddings / original - (s["factor"] - 1)
    return cfg.rope_theta * stretch ** (dim / (dim - 2))


def inverse_frequencies(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """Returns (inv_freq [head_dim/2] float32, attention scaling applied to cos and sin)."""
    dim, kind, s = cfg.head_dim, cfg.rope_type, cfg.rope_scaling
    inv_freq = _base_inv_freq(cfg.rope_theta, dim)
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / s["factor"], 1.0
    if kind == "dynamic":
        return _base_inv_freq(_dynamic_ntk_theta(cfg), dim), 1.0
    if kind == "llama3":
        return llama3_inv_freq(inv_freq, s), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(cfg, dim)
    raise ValueError(f"RoPE scaling {kind!r} is not supported")


# Speculative tokens past the model's last position are always discarded, but their forward still
# needs a table entry; the engine's speculation slack stays below this margin (at most 268: gammas of 128
# together, two trees of 64, 12 more; at 256 a table grew mid-request, and CUDA graphs held the old one).
POSITION_MARGIN = 512
ROWS_AT_ONCE = 1 << 16  # positions whose rotation is computed at a time


class RotaryEmbedding:
    """Precomputed cos/sin for positions [0, max_positions + margin) (more on `reach`); `rotate(x, positions)`
    applies them."""

    def __init__(self, cfg: ModelConfig, device: torch.device | str = "cpu"):
        self.inv_freq, self.scale = inverse_frequencies(cfg)
        self.cos, self.sin = self._rows(0, cfg.max_position_embeddings + POSITION_MARGIN, device)

    def _rows(self, start: int, end: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        dim = 2 * len(self.inv_freq)
        cos, sin = (torch.empty(end - start, dim, device=device) for _ in range(2))
        for first in range(start, end, ROWS_AT_ONCE):  # (the float32 temporaries of a whole table at once
            # took as much again: a 4.7 GB peak of resident memory for the 2.1 GB table of yarn x64
            # over 32K positions, 2.3 GB in pieces: ru_maxrss around RotaryEmbedding, a one-off check on the EPYC)
            last = min(end, first + ROWS_AT_ONCE)
            freqs = torch.outer(torch.arange(first, last, dtype=torch.float32), self.inv_freq)  # [P, D/2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
            cos[first - start:last - start] = (emb.cos() * self.scale).to(device)
            sin[first - start:last - start] = (emb.sin() * self.scale).to(device)
        return cos, sin

    def bound(self, positions: int) -> None:
        """Keeps the rows of the first `positions` (and the margin) only: where a request may use fewer
        positions than the model has (vLLM's max_model_len, a sliding window), before the first forward
        (`reach` grows it again should a draft's positions pass them)."""
        rows = positions + POSITION_MARGIN
        if rows < len(self.cos):
            self.cos, self.sin = self.cos[:rows].clone(), self.sin[:rows].clone()

    def turn(self, by: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [n, D] that turn vectors already rotated by `by` [n] more positions (either sign),
        without a second attention scaling."""
        cos, sin = self.cos[by.abs()], self.sin[by.abs()] * by.sign()[:, None]
        return (cos / self.scale).to(dtype), (sin / self.scale).to(dtype)

    def reach(self, position: int) -> None:
        """Makes the table cover `position` (a draft's keys are rotated at their positions in the text, which
        pass its own, and its streaming cache turns its sinks by the window's shift); the entries it had
        stay as they were."""
        if position >= len(self.cos):
            cos, sin = self._rows(len(self.cos), max(position + POSITION_MARGIN, 2 * len(self.cos)), self.cos.device)
            self.cos, self.sin = torch.cat((self.cos, cos)), torch.cat((self.sin, sin))

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [n] int64 -> (cos, sin), each [n, D] in `dtype`; computed once per forward."""
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [H, n, D]; positions: [n] int64. Returns x rotated, in x's dtype."""
        return rope(x, *self.cos_sin(positions, x.dtype))
