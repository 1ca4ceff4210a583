"""From logits to the distribution a tier samples from, and drawing from it.

Every tier applies the same processing (logit bias, allowed token ids, temperature, min-p, top-k, top-p:
`processed`), so each
tier's distribution is the one plain sampling from that tier's model would use; the target's is the
output distribution.
Temperature 0 means greedy, as does any below GREEDY_BELOW (vLLM's bound; dividing logits by 1e-40 made
them infinite and the distribution NaN): a one-hot distribution on the argmax (first index on ties), so
the speculative-sampling rules reduce to exact greedy matching without any division by zero.
"""
from __future__ import annotations

import math
import os
from functools import lru_cache

import torch

from ..errors import NonFiniteLogits

GREEDY_BELOW = 1e-5  # a temperature below this samples greedily (vLLM's _SAMPLING_EPS)
# sample_distinct sums the mass afresh once what is left falls below this fraction of the sum it draws from
REFRESH_BELOW = 1e-6
TOP_P_CANDIDATES = (64, 4096)  # a row's largest logits that top-p ranks first, then more (top_p_dropped)
ROW_CHUNK = 128  # entries per chunk of a vocabulary row, in the first pass of row_argmax and one_draw
# torch's CPU generator state (5,056 bytes): mt19937's 624 words, 8 bytes each (the low 4 read), from byte 24
MT_WORDS, MT_AT, MT_STATE_BYTES = 624, 24, 5056


def processed(logits: torch.Tensor, params) -> torch.Tensor:
    """A request's distributions: `probabilities` with its SamplingParams' settings (every tier's rows)."""
    return probabilities(logits, params.temperature, params.top_k, params.top_p, params.logit_bias, params.min_p,
                         params.allowed_token_ids)


def probabilities(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                  bias: tuple[tuple[int, float], ...] = (), min_p: float = 0.0,
                  allowed: tuple[int, ...] | None = None) -> torch.Tensor:
    """logits: [n, V] -> probabilities [n, V] float32. `bias`: (token, value) pairs added to the logits
    first (OpenAI's logit_bias; a token a reduced-vocabulary draft lacks stays impossible for it). Then
    only the `allowed` token ids keep their logits (vLLM's allowed_token_ids; None: all). After the
    temperature, in vLLM's order: `min_p` drops the tokens less likely than min_p times the most likely
    one, then top-k, then top-p."""
    logits = logits.float()
    if bias:
        ids, values = zip(*bias)
        logits = logits.clone()
        logits[..., list(ids)] += torch.tensor(values, dtype=logits.dtype, device=logits.device)
    if allowed is not None:
        logits = only_allowed(logits, _refused(allowed, logits.shape[-1], logits.device))
    if temperature < GREEDY_BELOW:  # a row with NaN or +inf logits (overflowed) stays NaN, as it does sampled
        # A row's argmax is at a NaN where it holds one (argmax counts NaN as the largest), else at +inf where
        # it holds +inf; the first on ties. One pass over the logits (row_argmax) and one over the rows written
        # (one_hot's int64 rows and two scans for NaN and +inf cost a batch-8 greedy check 3x this).
        index = row_argmax(logits)[..., None]
        top = logits.gather(-1, index)
        rows = torch.zeros_like(logits).scatter_(-1, index, 1.0)
        overflowed = top.isnan() | top.isposinf()
        if logits.device.type != "cpu" or bool(overflowed.any()):  # (no host sync on a GPU)
            rows.masked_fill_(overflowed, float("nan"))
        return rows
    logits = logits / temperature
    if min_p > 0:
        probs = logits.softmax(dim=-1)
        logits = logits.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        logits = logits.masked_fill(top_p_dropped(logits, top_p), float("-inf"))
    return logits.softmax(dim=-1)


def top_p_dropped(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """bool [..., V]: the tokens top-p drops from each row of `logits`: those the tokens ranked above them
    already reach top_p with (the first is always kept). On a CPU, ranked among each row's 64 largest where
    those reach top_p (every token past them is then dropped), else among its 4,096 largest
    (TOP_P_CANDIDATES), and by a sort of the whole row only where those fall short too: the sort of
    SmolLM2's 49,152 logits took 2.1 ms a row on the 2-core Zen 4 (3.8 ms for a row alone), more than a
    draft's forward, and a top-p request paid it on every row of every tier (`python
    benchmarks/top_p_cost.py`). The same tokens as the sort but where a tie or a rounding of the cumulative
    sum sits at the boundary; a row's the same alone or beside others. On a GPU, the sort (the stages would
    sync with the host to pick rows)."""
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.device.type != "cpu":
        return top_p_dropped_by_sort(rows, top_p).reshape(logits.shape)
    full = rows.softmax(dim=-1)  # row by row, as alone (a sum over the rows' [n, V] rounds by n: a row's cut
    # moved by a token with the rows beside it, so a check's target rows and a step's parted)
    dropped = torch.ones_like(rows, dtype=torch.bool)
    left = torch.arange(rows.shape[0])  # the rows not settled yet
    for k in TOP_P_CANDIDATES:
        if k >= rows.shape[-1] or not len(left):
            break
        probs, ids = full[left].topk(k, dim=-1)  # [rows left, k], largest first
        cumulative = probs.cumsum(dim=-1)
        settled = cumulative[:, -1] >= top_p  # (NaN rows never are: the sort drops none of theirs, as before)
        at = left[settled]
        dropped[at] = dropped[at].scatter_(-1, ids[settled], ((cumulative - probs) >= top_p)[settled])
        left = left[~settled]
    if len(left):
        probs, order = full[left].sort(dim=-1, descending=True)
        dropped_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        dropped[left] = torch.zeros_like(dropped_sorted).scatter_(-1, order, dropped_sorted)
    return dropped.reshape(logits.shape)


def top_p_dropped_by_sort(rows: torch.Tensor, top_p: float) -> torch.Tensor:
    """top_p_dropped of rows [n, V] by a sort of each whole row."""
    sorted_logits, order = rows.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    dropped_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
    return torch.zeros_like(dropped_sorted).scatter_(-1, order, dropped_sorted)


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1): the index of each row's largest value, the first on ties, a NaN counting as the
    largest (as torch's). On the CPU, over rows of two whole chunks or more, in two passes that vectorise:
    each chunk's largest value (amax, which propagates NaN), then the first chunk holding the row's largest and
    the first index of it there. torch's argmax walks a row an element at a time: 138 us for one row of
    SmolLM2's 49,152 tokens on the 2-core AMX Xeon against 66, 784 against 171 for twelve (`python
    benchmarks/row_argmax.py`, benchmarks/results/issue12/amx4/); greedy rows take it many times per token."""
    width = x.shape[-1] if x.dim() else 1
    if x.device.type != "cpu" or width % ROW_CHUNK or width < 2 * ROW_CHUNK or x.numel() == 0:
        return x.argmax(dim=-1)
    rows = x.reshape(-1, width // ROW_CHUNK, ROW_CHUNK)
    chunk = rows.amax(dim=-1).argmax(dim=-1)  # [n]: the first chunk holding the row's largest
    within = rows[torch.arange(rows.shape[0]), chunk].argmax(dim=-1)
    return (chunk * ROW_CHUNK + within).reshape(x.shape[:-1])


def only_allowed(logits: torch.Tensor, refused: torch.Tensor) -> torch.Tensor:
    """logits [n, V] with the `refused` tokens (bool, [V] or [n, V]) at -inf, a new tensor. A row left with
    no finite logit (a reduced-vocabulary draft lacking every allowed token; rules that contradict each
    other) becomes uniform over the tokens not refused: a distribution to propose from, where
    verification corrects it (a target's logits are finite everywhere; where its own rows are left with no
    token, the request's rules contradict each other, and rules.check_obeyed ends it)."""
    out = logits.masked_fill(refused, float("-inf"))
    empty = torch.isneginf(out).all(-1, keepdim=True)  # chosen per row without a host sync
    return out.masked_fill(empty & ~refused, 0.0)


@lru_cache(maxsize=16)
def _refused(allowed: tuple[int, ...], vocab_size: int, device: torch.device) -> torch.Tensor:
    """bool [V]: the tokens outside `allowed` (ids past the vocabulary ignored)."""
    refused = torch.ones(vocab_size, dtype=torch.bool)
    refused[[t for t in allowed if t < vocab_size]] = False
    return refused.to(device)


def top_probability(logits: torch.Tensor) -> float:
    """logits: [V] -> the probability the model gives its most likely token at temperature 1 (its own
    confidence, whatever the request's sampling settings)."""
    return float(top_probabilities(logits))


def top_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """logits: [..., V] -> [...]: top_probability of each row."""
    logits = logits.float()
    return torch.exp(logits.amax(dim=-1) - torch.logsumexp(logits, dim=-1))


def non_finite() -> NonFiniteLogits:
    return NonFiniteLogits("the distribution to sample from holds NaN or infinity: the model's logits "
                           "overflowed (a float16 or bfloat16 model past its range?)")


def unseeded_generator() -> torch.Generator:
    """A CPU generator for a request without a seed, its mt19937 state drawn whole from os.urandom. One seeded
    by a number keeps the number's low 32 bits (manual_seed), so unseeded requests shared 2**32 streams: of
    10**5 of them, two ran the same one with probability 0.69, and alike, gave the same sample."""
    generator = torch.Generator()
    state = generator.get_state()
    if state.numel() != MT_STATE_BYTES:  # (a layout this does not know: seeded by a number, as before)
        return generator.manual_seed(int.from_bytes(os.urandom(8), "little"))
    words = state[MT_AT: MT_AT + 8 * MT_WORDS].view(MT_WORDS, 8)
    words[:, :4] = torch.frombuffer(bytearray(os.urandom(4 * MT_WORDS)), dtype=torch.uint8).view(MT_WORDS, 4)
    words[:, 4:] = 0
    return generator.set_state(state)


def check_finite(probs: torch.Tensor) -> None:
    """NonFiniteLogits unless the distribution probs [V] an output token follows is finite."""
    if not torch.isfinite(probs.sum()):
        raise non_finite()


def sample(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool, proposal: bool = False) -> int:
    """probs: [V]. Greedy takes the argmax without consuming randomness. `proposal`: a proposer's draw,
    which may come from a row holding NaN (sample_distinct)."""
    if greedy:
        if proposal:
            return int(row_argmax(probs))
        # the token and whether its row is finite in one transfer (one sync on a GPU, as the argmax alone)
        token, finite = torch.stack([row_argmax(probs), torch.isfinite(probs.sum())]).tolist()
        if not finite:
            raise non_finite()
        return token
    drawn = sample_distinct(probs, 1, generator, proposal)
    if not drawn:
        raise ValueError("cannot sample from a distribution with no probability mass")
    return drawn[0]


def one_draw(probs: torch.Tensor, generator: torch.Generator | None, proposal: bool = False) -> int | None:
    """One token from probs [V] as sample_distinct draws it (one float64 uniform times the mass, the first
    token whose cumulative mass exceeds it), in two levels: the cumulative masses of chunks of ROW_CHUNK
    tokens (one vectorised float64 sum), the chunk where the uniform falls, then the token within it. The
    same uniform gives the same token as the flat cumulative sum but where the two sums round apart, and
    a token of probability 0 is never drawn; the flat sum's sequential pass over the whole row took about
    half of a draw (219 against 104 us at 49,152 tokens on the 2-core AMX Xeon: `python
    benchmarks/sampling_draws.py`, benchmarks/results/issue12/amx4/sampling_draws_*.json). None where this does not apply: a row of no whole number of chunks, one with no mass,
    a proposer's whose mass is not finite (the flat sum draws from it); raises for an output's such row."""
    if probs.dim() != 1 or probs.device.type != "cpu" or len(probs) % ROW_CHUNK or len(probs) < 2 * ROW_CHUNK:
        return None
    chunks = probs.reshape(-1, ROW_CHUNK).sum(dim=1, dtype=torch.float64).cumsum(0)
    total = float(chunks[-1])
    if not math.isfinite(total):
        if proposal:
            return None
        raise non_finite()
    if total <= 0:
        return None
    x = float(torch.rand((), generator=generator, dtype=torch.float64)) * total
    chunk = int(torch.searchsorted(chunks, torch.tensor([x], dtype=torch.float64), right=True))
    if chunk == len(chunks):  # rounding carried x past the last token of mass
        return int(torch.nonzero(probs)[-1])
    x -= float(chunks[chunk - 1]) if chunk else 0.0
    weights = probs[chunk * ROW_CHUNK:(chunk + 1) * ROW_CHUNK].double()
    token = int(torch.searchsorted(weights.cumsum(0), torch.tensor([x], dtype=torch.float64), right=True))
    if token == ROW_CHUNK:  # rounding carried x past the chunk's last token of mass
        token = int(torch.nonzero(weights)[-1])
    return chunk * ROW_CHUNK + token


def sample_distinct(probs: torch.Tensor, k: int, generator: torch.Generator | None,
                    proposal: bool = False) -> list[int]:
    """Up to k distinct tokens drawn without replacement from probs [V] (non-negative, any total), in draw
    order: each from the distribution renormalised over the tokens not drawn yet; fewer where fewer have
    probability > 0.

    By inverse CDF over a float64 cumulative sum: a uniform on the mass not drawn yet is carried past the
    intervals of the tokens already drawn (in index order), then the token is the first whose cumulative
    mass exceeds it, so tokens of probability 0 are never drawn. Once the mass left falls below the sum's
    rounding (a large token drawn before tiny ones, which the sum gave no width), the sum is taken afresh
    over the tokens left. At V = 49,152 on the 2-core Xeon about 0.1 ms for one token and 0.17 ms for four,
    against 0.9 ms for torch.multinomial, its exponential draws (benchmarks/sampling_draws.py). One token
    (every chain's draw) takes `one_draw`'s two levels where they apply."""
    if k == 1 and (token := one_draw(probs, generator, proposal)) is not None:
        return [token]
    weights = probs.double()
    # NaN counts as mass and the draw falls through to the last token with mass: a silent wrong token from
    # the distribution an output follows. A proposer's such token is only checked (with its NaN probability
    # it is rejected, and the residual is the checker's own row), so a `proposal` draws it.
    if not proposal:
        check_finite(weights)
    k = min(k, int(torch.count_nonzero(weights)))
    cumulative, carried = weights.cumsum(0), []  # carried: drawn tokens still inside `cumulative`
    drawn: list[int] = []
    for _ in range(k):
        total = float(cumulative[-1])
        left = total - sum(float(weights[t]) for t in carried)
        if left <= REFRESH_BELOW * total:
            weights = weights.clone()
            weights[drawn] = 0
            cumulative, carried = weights.cumsum(0), []
            left = float(cumulative[-1])
        x = float(torch.rand((), generator=generator, dtype=torch.float64)) * left
        for token in sorted(carried):
            if token > 0 and x < float(cumulative[token - 1]):  # below the drawn token's interval
                break
            x += float(weights[token])
        token = int(torch.searchsorted(cumulative, torch.tensor([x], dtype=torch.float64), right=True))
        if token == len(weights) or token in drawn:  # rounding carried x past the last token of mass
            token = max(i for i in torch.nonzero(weights).flatten().tolist() if i not in drawn)
        drawn.append(token)
        carried.append(token)
    return drawn
