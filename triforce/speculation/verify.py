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

from ..errors import NonFiniteLogits
from .sampling import non_finite, row_argmax, sample


@dataclass(frozen=True)
class ChainVerdict:
    accepted: int  # how many draft tokens were kept (0..g)
    next_token: int  # the recovered token (accepted < g) or the bonus token (accepted == g); -1 where failed
    # Where the row the next token follows is not finite (the checker's logits overflowed): the error that
    # ends this sequence's request, while the others verified with it go on
    failed: NonFiniteLogits | None = None


def verify_chain(draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                 generator: torch.Generator | None, greedy: bool) -> ChainVerdict:
    """One sequence's chain: draft_probs [g, V]; target_probs [g + 1, V] (float32, same device). Raises
    its verdict's `failed`."""
    verdict = verify_chains([draft_tokens], [draft_probs], [target_probs], [generator], [greedy])[0]
    if verdict.failed is not None:
        raise verdict.failed
    return verdict


def verify_chains(draft_tokens: list[list[int]], draft_probs: list[torch.Tensor], target_probs: list[torch.Tensor],
                  generators: list[torch.Generator | None], greedy: list[bool],
                  proposals: list[bool] | None = None) -> list[ChainVerdict]:
    """Many sequences' chains at once: sequence b proposed g_b = len(draft_tokens[b]) tokens, with its
    proposer's distributions draft_probs[b] [g_b, V] and its checker's target_probs[b] [g_b + 1, V]. The
    accept decisions of all sequences ([B, max g] padded) and their next-token distributions ([B, V], a
    residual unnormalised) are computed together; the distributions themselves stay where they are
    (copying every row into one flat tensor, as vLLM's sampler takes them on a GPU, costs more than it
    saves on a CPU).

    Each sequence draws from its own generator, in the order a chain alone would: g_b uniforms (none
    when greedy), then the recovered or bonus token. So a sequence's verdict is the same alone and in
    any batch. `proposals[b]`: sequence b's checker proposes in turn to a tier above, so that its next
    token is a proposal (a row of it that is not finite is no failure: sampling.sample)."""
    counts = [len(t) for t in draft_tokens]
    proposals = proposals or [False] * len(counts)
    device = target_probs[0].device
    width = max(counts, default=0)
    count = torch.tensor(counts, device=device)
    accepted = torch.zeros(len(counts), dtype=torch.long, device=device)
    if width:
        # each proposal's probability at the checker and at the proposer, [B, G] padded past g_b
        p_target = torch.zeros(len(counts), width, device=device)
        p_draft = torch.ones(len(counts), width, device=device)
        uniform = torch.zeros(len(counts), width, device=device)
        for b, (tokens, g) in enumerate(zip(draft_tokens, counts)):
            if g:
                index, rows = torch.tensor(tokens, device=device), torch.arange(g, device=device)
                p_target[b, :g], p_draft[b, :g] = target_probs[b][rows, index], draft_probs[b][rows, index]
                if not greedy[b]:
                    uniform[b, :g] = torch.rand(g, generator=generators[b], device=device)
        real = torch.arange(width, device=device)[None, :] < count[:, None]
        greedy_rows = torch.tensor(greedy, device=device)[:, None]
        # greedy: one-hot rows, so the draft token is kept when it is the target's argmax
        keep = torch.where(greedy_rows, p_target >= p_draft, uniform * p_draft < p_target) | ~real
        accepted = keep.long().cumprod(dim=1).sum(dim=1).minimum(count)  # [B]
    kept = accepted.tolist()
    rejected = [a < g for a, g in zip(kept, counts)]
    # the distribution of each sequence's next token: the residual at its first rejection, else the bonus row
    target_rows = torch.stack([t[a] for t, a in zip(target_probs, kept)])  # [B, V]
    no_draft = torch.zeros_like(target_rows[0])  # a bonus row has no proposal to take away
    draft_rows = torch.stack([d[a] if r else no_draft for d, a, r in zip(draft_probs, kept, rejected)])
    residual = (target_rows - draft_rows).clamp_min(0)
    # A rejection leaves positive residual mass in exact arithmetic; if rounding erased it the two
    # distributions were equal to float precision, and the target's is the limit.
    use_residual = torch.tensor(rejected, device=device)[:, None] & (residual.sum(dim=1, keepdim=True) > 1e-12)
    # The residual is drawn from as it is, unnormalised (sample draws a uniform times a row's own mass): a
    # row's sum over [B, V] rounds otherwise than over [1, V] with several threads (torch splits a lone
    # row's sum between them), and dividing by it would make a seeded draw depend on the batch.
    next_probs = torch.where(use_residual, residual, target_rows)
    # every row's argmax (greedy's token) and whether it is finite, in one transfer (one sync on a GPU)
    argmax, finite = torch.stack([row_argmax(next_probs), torch.isfinite(next_probs.sum(dim=1))]).tolist()
    verdicts = []
    for b, (a, gen, is_greedy, proposal) in enumerate(zip(kept, generators, greedy, proposals)):
        if not (finite[b] or proposal):  # an output drawn from an overflowed row: this sequence fails
            verdicts.append(ChainVerdict(a, -1, non_finite()))
        else:
            verdicts.append(ChainVerdict(a, argmax[b] if is_greedy else sample(next_probs[b], gen, False, proposal)))
    return verdicts
