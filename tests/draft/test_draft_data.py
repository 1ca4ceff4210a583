"""Training text is tokenized only as far as the sequences asked for take, with the same sequences as
tokenizing it whole."""
import random

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from triforce.draft.data import leading_sequences, pack
from triforce.errors import UserError


def prose(seed: int, paragraphs: int) -> str:
    rng = random.Random(seed)
    words = ["the", "there", "then", "Emma", "Mr.", "Knightley", "said", "was", "not", "quite", "so", "well"]
    return "\n\n".join(" ".join(rng.choice(words) for _ in range(rng.randrange(5, 40))) + "."
                       for _ in range(paragraphs))


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE with merges across letters and spaces, as real vocabularies have, that counts the
    characters it is given."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([prose(9, 300)], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")

    class Counting:
        eos_token_id = fast.eos_token_id
        seen = 0

        def __call__(self, text):
            self.seen += len(text)
            return fast(text)
    return Counting()


def test_leading_sequences_equal_those_of_the_whole_texts_tokenizing_less(bpe):
    texts = [prose(1, 3000), prose(2, 50), prose(3, 3000)]
    whole = pack([bpe(t).input_ids for t in texts], 32, bpe.eos_token_id)
    for count in (1, 7, 40, 400):
        bpe.seen = 0
        got = leading_sequences(bpe, texts, 32, count, bpe.eos_token_id)
        assert got.equal(whole[:count])
        assert bpe.seen < len(texts[0]) / 2  # the first text alone holds them: a part of it read
    reach = whole.shape[0] * 3 // 4  # the first two texts whole, then part of the third
    bpe.seen = 0
    assert leading_sequences(bpe, texts, 32, reach, bpe.eos_token_id).equal(whole[:reach])
    assert len(texts[0]) + len(texts[1]) < bpe.seen < sum(map(len, texts))
    assert leading_sequences(bpe, texts, 32, 10 ** 6, bpe.eos_token_id).equal(whole)  # fewer than asked


def test_a_text_without_line_breaks_is_cut_anywhere_and_still_agrees(bpe):
    text = prose(4, 2000).replace("\n", " ")
    whole = pack([bpe(text).input_ids], 16)
    assert leading_sequences(bpe, [text], 16, 5).equal(whole[:5])


def test_too_little_text_for_one_sequence_is_a_user_error(bpe):
    with pytest.raises(UserError, match="no complete sequence of 4096 tokens"):
        leading_sequences(bpe, [prose(5, 3)], 4096, 1)
