"""Exact speculative sampling of a chain (Leviathan et al. 2023, Chen et al. 2023).

Terms. A *draft* proposed tokens x_1..x_g, each sampled from `draft_probs[i]`; the verifier computed
`target_probs[i]` for the same positions plus one more. Walking the chain:
- *accepted* token: x_i is kept with probability min(1, target_probs[i][x_i] / draft_probs[i][x_i]);
- *recovered* token: at the first rejection, a token is sampled from the residual
  normalize(max(target_probs[i] - draft_probs[i], 0)) and the chain ends;
- *bonus* token: when all g are accepted, one more is sampled from target_probs[g].
Each output token is then distributed exactly as sampling from target_probs. In a hierarchy every tier
runs this same rule against the tier below (TriForce, arXiv 2404.11912): the residual is taken at
every tier, never replaced by the lower tier's distribution.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample


@dataclass(frozen=True)
class ChainVerdict:
    accepted: int  # how many draft tokens were kept (0..g)
    next_token: int  # the recovered token (accepted < g) or the bonus token (accepted == g)


def verify_chain(draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                 generator: torch.Generator | None, greedy: bool) -> ChainVerdict:
    """One sequence's chain: draft_probs [g, V]; target_probs [g + 1, V] (float32, same device)."""
    return verify_chains([draft_tokens], draft_probs, target_probs, [generator], [greedy])[0]


def verify_chains(draft_tokens: list[list[int]], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                  generators: list[torch.Generator | None], greedy: list[bool]) -> list[ChainVerdict]:
    """Many sequences' chains at once, flattened as vLLM's rejection sampler takes them: sequence b
    proposed g_b = len(draft_tokens[b]) tokens; `draft_probs` [sum g_b, V] holds their distributions in
    sequence order and `target_probs` [sum (g_b + 1), V] the checker's, g_b + 1 rows per sequence.

    Each sequence draws from its own generator, in the order a chain alone would: g_b uniforms (none
    when greedy), then the recovered or bonus token. So a sequence's verdict is the same alone and in
    any batch; the arithmetic on all sequences' rows is done together."""
    counts = [len(t) for t in draft_tokens]
    batch, device = len(counts), target_probs.device
    width = max(counts, default=0)
    # [B, G] views of the flat rows, padded past each sequence's g_b
    seq = torch.arange(batch, device=device)
    pos = torch.arange(width, device=device)
    draft_start = torch.tensor([0] + counts[:-1], device=device).cumsum(0)
    target_start = draft_start + seq  # each earlier sequence has one target row more
    real = pos[None, :] < torch.tensor(counts, device=device)[:, None]  # [B, G]
    draft_row = (draft_start[:, None] + pos[None, :]).where(real, 0)
    tokens = torch.zeros(batch, width, dtype=torch.long, device=device)
    if width:
        tokens[real] = torch.tensor([t for chain in draft_tokens for t in chain], device=device)
        p_target = target_probs[(target_start[:, None] + pos[None, :]).where(real, 0), tokens]  # [B, G]
        p_draft = draft_probs[draft_row, tokens]
        uniform = torch.zeros(batch, width, device=device)
        for b, (g, gen, is_greedy) in enumerate(zip(counts, generators, greedy)):
            if g and not is_greedy:
                uniform[b, :g] = torch.rand(g, generator=gen, device=device)
        greedy_rows = torch.tensor(greedy, device=device)[:, None]
        # greedy: one-hot rows, so the draft token is kept when it is the target's argmax
        keep = torch.where(greedy_rows, p_target >= p_draft, uniform * p_draft < p_target) | ~real
        accepted = keep.long().cumprod(dim=1).sum(dim=1).minimum(torch.tensor(counts, device=device))  # [B]
    else:
        accepted = torch.zeros(batch, dtype=torch.long, device=device)
    # the distribution of each sequence's next token: the residual at its first rejection, else the bonus row
    rejected = accepted < torch.tensor(counts, device=device)
    target_rows = target_probs[target_start + accepted]  # [B, V]
    draft_rows = draft_probs[(draft_start + accepted).where(rejected, 0)] if width else torch.zeros_like(target_rows)
    residual = (target_rows - draft_rows).clamp_min(0)
    total = residual.sum(dim=1, keepdim=True)
    # A rejection leaves positive residual mass in exact arithmetic; if rounding erased it the two
    # distributions were equal to float precision, and the target's is the limit.
    use_residual = rejected[:, None] & (total > 1e-12)
    next_probs = torch.where(use_residual, residual / total.clamp_min(1e-30), target_rows)
    argmax = next_probs.argmax(dim=1).tolist()
    return [ChainVerdict(a, argmax[b] if is_greedy else sample(next_probs[b], gen, False))
            for b, (a, gen, is_greedy) in enumerate(zip(accepted.tolist(), generators, greedy))]
