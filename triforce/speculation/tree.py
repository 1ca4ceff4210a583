"""Exact speculative sampling of a token tree (Sequoia, arXiv 2402.12374: verification with siblings
sampled without replacement).

Terms. A *proposer* grew a tree of N nodes below the *root*, the position right after the committed
prefix: node i holds token `tokens[i]` and hangs below `parents[i]` (-1: the root; parents[i] < i). The
children of a node were sampled *without replacement* from the proposer's distribution there, in their
index order (`sample_children`). Rows of the distributions are per *slot*: slot 0 is the root, slot i + 1
is node i; `draft_probs[s]` is the proposer's distribution the children of slot s were drawn from and
`target_probs[s]` the verifier's distribution for the token after slot s.

Verification walks down from the root. At a slot with target distribution t and proposer distribution
d, the children x_1, x_2, ... are tried in order:
- *accepted*: x_k is kept with probability min(1, t[x_k] / d[x_k]); the walk moves to that child;
- on a rejection, t becomes the residual normalize(max(t - d, 0)) and d the proposer's distribution with
  x_k removed, renormalised (the distribution x_{k+1} was drawn from);
- *recovered* token: when every child is rejected, one token is drawn from the final residual t;
- *bonus* token: at a leaf (no children), one token is drawn from the verifier's row of that leaf.
Each output token is then distributed exactly as sampling from the verifier: each rejection leaves the
residual and the renormalised proposer exactly as a one-token check would, and the next child was drawn
from that renormalised proposer (tests/speculation/test_tree.py checks it against the verifier).
A chain is the tree with one child per node, where this is `verify_chain`. Greedy (one-hot rows) reduces
to following the child that holds the verifier's argmax and emitting the argmax where none does.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .sampling import sample, sample_distinct


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # accepted node indices, root first (each the previous one's child)
    next_token: int  # the recovered token, or the bonus token after a leaf


def children_of(parents: Sequence[int]) -> list[list[int]]:
    """Per slot (0 = the root, i + 1 = node i): its children's node indices, in sampling order."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    return children


def verify_tree(tokens: Sequence[int], parents: Sequence[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                generator: torch.Generator | None, greedy: bool, proposal: bool = False) -> TreeVerdict:
    """draft_probs, target_probs: [N + 1, V] float32, one row per slot (rows of leaves in draft_probs are
    not read). `proposal`: the verifier proposes in turn to a tier above (its next token is a proposal: a
    row of it that is not finite is no error, sampling.sample)."""
    children = children_of(parents)
    path: list[int] = []
    slot = 0
    while True:
        target = target_probs[slot]
        if greedy:
            best = sample(target, None, True, proposal)  # (NonFiniteLogits where an output's row is not finite)
            kept = next((c for c in children[slot] if tokens[c] == best), None)
            if kept is None:
                return TreeVerdict(path, best)
        else:
            kept, target = _try_children(children[slot], tokens, draft_probs[slot], target, generator)
            if kept is None:
                return TreeVerdict(path, sample(target, generator, False, proposal))
        path.append(kept)
        slot = kept + 1


def _try_children(children: list[int], tokens: Sequence[int], draft: torch.Tensor, target: torch.Tensor,
                  generator: torch.Generator | None) -> tuple[int | None, torch.Tensor]:
    """The accepted child (or None) and the distribution to draw from if none is accepted."""
    if not children:
        return None, target
    uniforms = torch.rand(len(children), generator=generator)
    for child, u in zip(children, uniforms.tolist()):
        x = tokens[child]
        if u * float(draft[x]) < float(target[x]):  # u < target / draft, without dividing
            return child, target
        residual = (target - draft).clamp_min(0)
        total = residual.sum()
        # A rejection leaves positive residual mass in exact arithmetic; if rounding erased it the two
        # distributions were equal to float precision, and the target's is the limit.
        target = residual / total if total > 1e-12 else target
        draft = draft.clone()
        draft[x] = 0
        remaining = draft.sum()
        if remaining <= 0:  # nothing left to have drawn a further child from
            break
        draft = draft / remaining
    return None, target


def sample_children(draft: torch.Tensor, k: int, generator: torch.Generator | None, greedy: bool) -> list[int]:
    """Up to k distinct tokens drawn without replacement from draft [V], in draw order (each from the
    distribution renormalised over the tokens not drawn yet); fewer where fewer have probability > 0.
    Greedy: the k highest entries of `draft` (a greedy proposer's distribution is one-hot, so pass its
    logits to rank more than one child), highest first."""
    if greedy:
        return torch.topk(draft, min(k, draft.shape[-1]), sorted=True).indices.tolist()
    return sample_distinct(draft, k, generator, proposal=True)
