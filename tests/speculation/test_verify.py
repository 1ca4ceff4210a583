"""The output of one chain verification is distributed exactly as the target (chi-square, alpha = 1e-3).

Each test draws many draft chains from draft_probs and verifies them with a seeded generator, as one
batch (verify_chains; a chain's verdict is the same alone and in any batch, tested below); the first
output token must follow target_probs[0], including degenerate cases, and every later one its row.
"""
import pytest
import torch
from scipy.stats import chisquare

from triforce.speculation.verify import verify_chain, verify_chains

ALPHA = 1e-3
TRIALS = 6000


def output_counts(draft_probs, target_probs, trials, seed):
    """[g + 1, V]: how often each token was output at each position by `trials` verifications of chains
    drawn from draft_probs [g, V] against target_probs [g + 1, V]."""
    g = torch.Generator().manual_seed(seed)
    chains = torch.multinomial(draft_probs, trials, replacement=True, generator=g).T.tolist()  # [trials, g]
    verdicts = verify_chains(chains, [draft_probs] * trials, [target_probs] * trials, [g] * trials,
                             [False] * trials)
    counts = torch.zeros(target_probs.shape)
    for tokens, verdict in zip(chains, verdicts):
        for i, token in enumerate(tokens[:verdict.accepted] + [verdict.next_token]):
            counts[i, token] += 1
    return counts


def first_token_counts(draft_probs, target_probs, trials=TRIALS, seed=0):
    return output_counts(draft_probs, target_probs, trials, seed)[0]


def assert_matches(counts, probs):
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a token the target gives probability zero"
    expected = probs[support] * counts.sum()
    if support.sum() > 1:
        assert chisquare(counts[support].numpy(), expected.numpy()).pvalue > ALPHA


def rand_probs(rows, vocab, seed, sharp=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(rows, vocab, generator=g), -1)


@pytest.mark.parametrize("case", ["random", "equal", "disjoint", "zero_draft_mass", "one_hot_target"])
def test_first_token_follows_target(case):
    vocab, g = 6, 3
    draft, target = rand_probs(g, vocab, 1), rand_probs(g + 1, vocab, 2)
    if case == "equal":
        target = torch.cat([draft, rand_probs(1, vocab, 3)])
    elif case == "disjoint":
        draft[:, 3:] = 0
        target[:, :3] = 0
    elif case == "zero_draft_mass":  # the draft never proposes tokens the target likes
        draft[:, 0] = 0
    elif case == "one_hot_target":
        target = torch.zeros(g + 1, vocab)
        target[:, 4] = 1
    draft, target = draft / draft.sum(-1, keepdim=True), target / target.sum(-1, keepdim=True)
    assert_matches(first_token_counts(draft, target), target[0])


@pytest.mark.parametrize("case", ["random", "zero_draft_mass"])
def test_every_position_follows_the_target(case):
    """Past the first token too: the token at position i of the output, among the trials that reach it
    (i tokens accepted before it), follows target_probs[i], whether a proposal kept, a residual at i or
    the bonus row after a whole accepted chain (a residual taken from the wrong draft row passed the
    first-token test)."""
    vocab, g, trials = 5, 3, 8000
    draft, target = rand_probs(g, vocab, 11, sharp=1.0), rand_probs(g + 1, vocab, 12, sharp=1.0)
    if case == "zero_draft_mass":
        draft[:, 1] = 0
        draft = draft / draft.sum(-1, keepdim=True)
    counts = output_counts(draft, target, trials, seed=3)
    assert counts[1:].sum(-1).min() > 500  # every position reached often enough to tell
    for i in range(g + 1):
        assert_matches(counts[i], target[i])


def test_equal_distributions_accept_everything():
    probs = rand_probs(4, 5, 9)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        tokens = [int(torch.multinomial(row, 1, generator=g)) for row in probs[:3]]
        assert verify_chain(tokens, probs[:3], probs, g, greedy=False).accepted == 3


def test_greedy_accepts_the_matching_prefix_then_corrects():
    target = torch.nn.functional.one_hot(torch.tensor([2, 0, 1, 3]), 4).float()
    draft = torch.nn.functional.one_hot(torch.tensor([2, 0, 3]), 4).float()
    verdict = verify_chain([2, 0, 3], draft, target, None, greedy=True)
    assert (verdict.accepted, verdict.next_token) == (2, 1)
    assert verify_chain([2, 0, 1], draft, target, None, greedy=True).next_token == 3


def test_chains_verified_together_get_each_its_verdict_alone():
    """verify_chains on a flattened batch (ragged lengths, an empty chain, greedy beside sampled): every
    sequence's verdict, and its generator's state after, are what verifying it alone gives."""
    vocab = 12
    lengths, greedy = [3, 0, 5, 1, 4], [False, False, True, False, False]
    chains, drafts, targets = [], [], []
    for b, g in enumerate(lengths):
        draft = rand_probs(g, vocab, 100 + b, sharp=1.0 + b)
        target = rand_probs(g + 1, vocab, 200 + b)
        if greedy[b]:
            draft = torch.nn.functional.one_hot(draft.argmax(-1), vocab).float()
            target = torch.nn.functional.one_hot(target.argmax(-1), vocab).float()
            target[1] = draft[1]  # the greedy chain keeps some proposals when they match
        chains.append([int(torch.multinomial(row, 1, generator=torch.Generator().manual_seed(b))) for row in draft])
        if greedy[b]:
            chains[-1] = draft.argmax(-1).tolist()
        drafts.append(draft)
        targets.append(target)
    for seed in range(40):
        alone, together = [], []
        gens_alone = [torch.Generator().manual_seed(seed * 10 + b) for b in range(len(lengths))]
        gens_together = [torch.Generator().manual_seed(seed * 10 + b) for b in range(len(lengths))]
        for b in range(len(lengths)):
            alone.append(verify_chain(chains[b], drafts[b], targets[b], gens_alone[b], greedy[b]))
        together = verify_chains(chains, drafts, targets, gens_together, greedy)
        assert together == alone
        for a, t in zip(gens_alone, gens_together):
            assert torch.equal(a.get_state(), t.get_state())  # the same draws, in the same order
    assert {v.accepted for v in together} != {0}  # some chains kept proposals


def test_a_rejected_chain_draws_from_the_same_residual_alone_and_in_a_batch(two_threads, monkeypatch):
    """The distribution a rejected chain's token is drawn from is the same bits alone and among other
    sequences: with two threads torch splits the sum of a lone row of a real vocabulary's size between them
    and sums a row of [B, V] whole, so normalising the residual by its sum gave other bits in a batch (as
    it does for these rows: checked first), and a seeded draw near a boundary could part."""
    import triforce.speculation.verify as verify

    vocab, batch = 49152, 4
    drafts = [rand_probs(2, vocab, 300 + b) for b in range(batch)]
    targets = [rand_probs(3, vocab, 400 + b) for b in range(batch)]
    # each chain's first proposal is the token the target wants least against the draft: rejected for sure
    chains = [[int((d[0] / t[0]).argmax()), 0] for d, t in zip(drafts, targets)]
    residuals = torch.stack([(t[0] - d[0]).clamp_min(0) for d, t in zip(drafts, targets)])
    sums = residuals.sum(dim=1)
    assert any(residuals[b:b + 1].sum(dim=1)[0] != sums[b] for b in range(batch))  # the split this is about
    real_sample, drawn_from = verify.sample, []

    def recording(probs, *args):
        drawn_from.append(probs.clone())
        return real_sample(probs, *args)

    def generators():
        return [torch.Generator().manual_seed(b) for b in range(batch)]

    with monkeypatch.context() as patch:
        patch.setattr(verify, "sample", recording)
        together = verify_chains(chains, drafts, targets, generators(), [False] * batch)
        alone = [verify_chains(chains[b:b + 1], drafts[b:b + 1], targets[b:b + 1], generators()[b:b + 1], [False])[0]
                 for b in range(batch)]
    assert together == alone and {v.accepted for v in alone} == {0}
    for b in range(batch):
        assert torch.equal(drawn_from[b], drawn_from[batch + b]), b
