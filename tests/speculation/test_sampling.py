import pytest
import torch

from triforce.speculation.sampling import probabilities, sample


def test_greedy_is_one_hot_on_first_argmax_without_nan():
    logits = torch.tensor([[1.0, 3.0, 3.0, -1.0], [float("-inf"), 0.0, 0.0, 0.0]])
    probs = probabilities(logits, 0.0)
    assert probs.tolist() == [[0, 1, 0, 0], [0, 1, 0, 0]]
    assert sample(probs[0], None, greedy=True) == 1


def test_temperature_scales_logits():
    logits = torch.randn(3, 10)
    torch.testing.assert_close(probabilities(logits, 0.5), torch.softmax(logits / 0.5, -1))


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.0, 2.0]])
    probs = probabilities(logits, 1.0, top_k=2)
    expected = torch.softmax(torch.tensor([5.0, 4.0]), 0)
    assert probs[0, [1, 3]].tolist() == pytest.approx(expected.tolist())
    assert probs[0, [0, 2, 4]].sum() == 0


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    base = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = base.log().unsqueeze(0)
    for top_p, kept in [(0.5, 1), (0.51, 2), (0.8, 2), (0.81, 3), (1.0, 4)]:
        probs = probabilities(logits, 1.0, top_p=top_p)[0]
        assert int((probs > 0).sum()) == kept, top_p
        torch.testing.assert_close(probs[:kept], base[:kept] / base[:kept].sum())


def test_seeded_sampling_is_reproducible():
    probs = torch.softmax(torch.randn(50), 0)
    draws = [[sample(probs, g, False) for _ in range(20)] for g in (torch.Generator().manual_seed(7),
                                                                     torch.Generator().manual_seed(7))]
    assert draws[0] == draws[1]
