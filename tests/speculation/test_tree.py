"""Tree verification (speculation/tree.py) outputs exactly the verifier's distribution (chi-square,
alpha = 1e-3): the first token of one check, and whole sequences made of many checks, at temperature 1
and with top-k and top-p; degenerate proposers; greedy follows the argmax."""
import itertools

import pytest
import torch
from scipy.stats import chisquare

from triforce.speculation.sampling import probabilities
from triforce.speculation.tree import children_of, sample_children, verify_tree

ALPHA = 1e-3
SHAPE = [-1, -1, -1, 0, 0, 1, 3]  # three children under the root, two under the first, a chain below


def grow(shape, draft_row, generator, greedy=False):
    """Tokens and parents of a tree of `shape` whose children are drawn without replacement from
    draft_row(slot path) (fewer where the proposer has fewer tokens); returns the tree and each node's
    path of tokens from the root."""
    tokens, parents, paths, slot_of = [], [], [], {-1: 0}
    for slot_node, kids in enumerate(children_of(shape)):
        node = slot_node - 1
        if node not in slot_of or not kids:
            continue
        prefix = [] if node == -1 else paths[slot_of[node] - 1]
        for shape_child, token in zip(kids, sample_children(draft_row(prefix), len(kids), generator, greedy)):
            tokens.append(token)
            parents.append(-1 if node == -1 else slot_of[node] - 1)
            paths.append(prefix + [token])
            slot_of[shape_child] = len(tokens)
    return tokens, parents, paths


def check(tokens, parents, paths, draft_row, target_row, generator, greedy=False):
    """One verification of a grown tree: rows per slot from the two models. Returns the output tokens."""
    slots = [[]] + paths
    draft = torch.stack([draft_row(p) for p in slots])
    target = torch.stack([target_row(p) for p in slots])
    verdict = verify_tree(tokens, parents, draft, target, generator, greedy)
    return [tokens[i] for i in verdict.path] + [verdict.next_token]


def assert_matches(counts, probs):
    support = probs > 0
    assert counts[~support].sum() == 0, "output a token of probability zero"
    if support.sum() > 1:
        assert chisquare(counts[support].numpy(), (probs[support] * counts.sum()).numpy()).pvalue > ALPHA


def rows(vocab, seed, processing=(1.0, 0, 1.0)):
    """A random distribution per context (the last token), processed as a tier would."""
    g = torch.Generator().manual_seed(seed)
    table = probabilities(2 * torch.randn(vocab + 1, vocab, generator=g), *processing)
    return lambda prefix: table[prefix[-1] if prefix else vocab]


CASES = {
    "random": lambda v: (rows(v, 1), rows(v, 2)),
    "equal": lambda v: (rows(v, 1), rows(v, 1)),
    # the proposer puts no mass where the verifier has any: every child is rejected
    "disjoint": lambda v: (lambda p: torch.tensor([0.5, 0.5] + [0.0] * (v - 2)),
                           lambda p: torch.tensor([0.0, 0.0] + [1.0 / (v - 2)] * (v - 2))),
    # two tokens of proposer mass under three children: the tree comes out smaller
    "few_tokens": lambda v: (lambda p: torch.tensor([0.0, 0.7, 0.3] + [0.0] * (v - 3)), rows(v, 2)),
    "one_hot_verifier": lambda v: (rows(v, 1), lambda p: torch.nn.functional.one_hot(torch.tensor(3), v).float()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_first_token_follows_the_verifier(case):
    vocab, trials = 6, 6000
    draft_row, target_row = CASES[case](vocab)
    g = torch.Generator().manual_seed(11)
    counts = torch.zeros(vocab)
    for _ in range(trials):
        tokens, parents, paths = grow(SHAPE, draft_row, g)
        counts[check(tokens, parents, paths, draft_row, target_row, g)[0]] += 1
    assert_matches(counts, target_row([]))


@pytest.mark.parametrize("processing", [(1.0, 0, 1.0), (1.0, 2, 1.0), (1.0, 0, 0.7)], ids=["t1", "top_k", "top_p"])
def test_sequences_of_checks_follow_the_verifier(processing):
    """Three tokens produced by repeated tree checks (each continuing after the last output) against the
    verifier's exact probability of every three-token sequence."""
    vocab, length, trials = 4, 3, 6000
    draft_row, target_row = rows(vocab, 3, processing), rows(vocab, 4, processing)
    g = torch.Generator().manual_seed(12)
    counts = torch.zeros([vocab] * length)
    for _ in range(trials):
        out = []
        while len(out) < length:
            context = out[-1:]
            draft_at = lambda p, c=context: draft_row(c + p)  # noqa: E731
            target_at = lambda p, c=context: target_row(c + p)  # noqa: E731
            tokens, parents, paths = grow(SHAPE, draft_at, g)
            out += check(tokens, parents, paths, draft_at, target_at, g)
        counts[tuple(out[:length])] += 1
    exact = torch.zeros([vocab] * length)
    for seq in itertools.product(range(vocab), repeat=length):
        exact[seq] = torch.prod(torch.stack([target_row(list(seq[:i]))[seq[i]] for i in range(length)]))
    assert_matches(counts.flatten(), exact.flatten())


def test_greedy_follows_the_verifiers_argmax():
    """Greedy trees hold the proposer's top children; the check keeps the child that is the verifier's
    argmax as long as there is one, then emits the argmax: plain greedy decoding."""
    vocab = 5
    draft_row, target_row = rows(vocab, 5), rows(vocab, 6, (0.0, 0, 1.0))
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        tokens, parents, paths = grow(SHAPE, lambda p: draft_row([seed % vocab] + p), g, greedy=True)
        out = check(tokens, parents, paths, draft_row, target_row, g, greedy=True)
        expected = []  # plain greedy decoding, as far as the tree reaches, then one more token
        while True:
            best = int(target_row(expected).argmax())
            expected.append(best)
            if expected not in paths:
                break
        assert out == expected


def test_children_are_distinct_and_follow_the_proposer_without_replacement():
    """The second child's distribution is the proposer's renormalised without the first."""
    draft = torch.tensor([0.5, 0.3, 0.2, 0.0])
    g = torch.Generator().manual_seed(0)
    pairs = torch.zeros(4, 4)
    for _ in range(6000):
        first, second = sample_children(draft, 2, g, greedy=False)
        pairs[first, second] += 1
    exact = torch.tensor([[draft[a] * draft[b] / (1 - draft[a]) if a != b else 0.0 for b in range(4)] for a in range(4)])
    assert_matches(pairs.flatten(), exact.flatten())
    assert sample_children(draft, 9, g, greedy=False).__len__() == 3  # only three tokens have mass
    assert sample_children(draft, 2, g, greedy=True) == [0, 1]
