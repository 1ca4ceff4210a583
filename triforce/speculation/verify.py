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
    """draft_probs: [g, V]; target_probs: [g + 1, V] (float32, same device)."""
    g = len(draft_tokens)
    if g:
        index = torch.tensor(draft_tokens, device=target_probs.device)
        rows = torch.arange(g, device=target_probs.device)
        p_target, p_draft = target_probs[rows, index], draft_probs[rows, index]  # [g]
        if greedy:
            keep = p_target >= p_draft  # one-hot rows: the draft token is the target's argmax
        else:
            uniform = torch.rand(g, generator=generator, device=target_probs.device)
            keep = uniform * p_draft < p_target  # u < p_target / p_draft, without dividing
        rejected = (~keep).nonzero()
        accepted = int(rejected[0]) if rejected.numel() else g
    else:
        accepted = 0
    if accepted < g:
        residual = (target_probs[accepted] - draft_probs[accepted]).clamp_min(0)
        total = residual.sum()
        # A rejection leaves positive residual mass in exact arithmetic; if rounding erased it the
        # two distributions were equal to float precision, and the target's is the limit.
        residual = residual / total if total > 1e-12 else target_probs[accepted]
        return ChainVerdict(accepted, sample(residual, generator, greedy))
    return ChainVerdict(accepted, sample(target_probs[g], generator, greedy))
