"""Incremental detokenization: the streamed pieces join to the decoded output, each round decodes a
short window (not the whole output again), stop strings split across rounds are found and never streamed."""
import random

import pytest

from checkpoints import byte_fallback_tokenizer, metaspace_tokenizer
from triforce.detokenize import IncrementalDetokenizer

TEXT = ("It is a truth universally acknowledged, that a café owner in Zürich — naïve or not — serves "
        "日本語 menus and 🙂 emoji to every guest.\n") * 6


class CountingTokenizer:
    """Wraps a tokenizer and records how many tokens each decode call was given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sizes = tokenizer, []

    def decode(self, tokens, **kwargs):
        self.sizes.append(len(tokens))
        return self.tokenizer.decode(tokens, **kwargs)


def stream_rounds(detok, tokens, seed):
    rng, pieces, at = random.Random(seed), [], 0
    while at < len(tokens) and not detok.stopped:
        step = rng.randint(1, 7)
        pieces.append(detok.add(tokens[at:at + step]))
        at += step
    pieces.append(detok.finish())
    return pieces


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_pieces_join_to_the_whole_decode_with_short_windows(smollm2_tokenizer, seed):
    tokens = smollm2_tokenizer(TEXT).input_ids
    counting = CountingTokenizer(smollm2_tokenizer)
    detok = IncrementalDetokenizer(counting)
    pieces = stream_rounds(detok, tokens, seed)
    whole = smollm2_tokenizer.decode(tokens, skip_special_tokens=True)
    assert "".join(pieces) == detok.text == whole
    assert not any("\ufffd" in p for p in pieces)  # an emoji split over tokens waits for its last byte
    # Each decode sees the last piece's tokens and the new ones: bounded, however long the output grows.
    assert len(tokens) > 150 and max(counting.sizes) <= 2 * 7 + 8


@pytest.mark.slow
def test_stop_string_across_rounds_is_found_and_never_streamed(smollm2_tokenizer):
    tokens = smollm2_tokenizer(TEXT).input_ids
    stop = "naïve or not"
    for seed in range(6):
        detok = IncrementalDetokenizer(smollm2_tokenizer, (stop, "never there"))
        pieces = stream_rounds(detok, tokens, seed)
        # The pieces end right before the stop string: none of its characters was streamed.
        assert detok.stopped and "".join(pieces) == detok.text == TEXT[: TEXT.index(stop)]


def test_word_tokenizer_stops_at_a_stop_string(tiny_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir("detok-words", tokenizer=True, vocab_size=40))
    tokens = [3 + (5 * i) % 37 for i in range(200)]
    detok = IncrementalDetokenizer(tokenizer, ("w7 w12",))
    pieces = stream_rounds(detok, tokens, 0)
    whole = tokenizer.decode(tokens, skip_special_tokens=True)
    assert "".join(pieces) == detok.text == whole[: whole.index("w7 w12")] and detok.stopped


def test_a_stop_string_within_the_first_min_tokens_does_not_count(smollm2_tokenizer):
    """vLLM's min_tokens: a stop string whose text ends within the first min_tokens tokens' is passed over,
    the next one stops; one that ends just past them stops."""
    tokens = smollm2_tokenizer(TEXT).input_ids
    line = TEXT.index("\n") + 1  # "Zürich" occurs once per line
    first = len(smollm2_tokenizer(TEXT[:TEXT.index("Zürich") + len("Zürich")]).input_ids)
    for seed in range(4):
        detok = IncrementalDetokenizer(smollm2_tokenizer, ("Zürich",), min_tokens=first)
        pieces = stream_rounds(detok, tokens, seed)
        assert detok.stopped and "".join(pieces) == detok.text == TEXT[: line + TEXT.index("Zürich")]
        detok = IncrementalDetokenizer(smollm2_tokenizer, ("Zürich",), min_tokens=first - 1)
        stream_rounds(detok, tokens, seed)
        assert detok.text == TEXT[: TEXT.index("Zürich")]


def test_the_text_is_what_the_prompt_is_followed_by():
    """A SentencePiece word marker is a space after other text: the first generated word, decoded after
    the prompt, keeps it (" truth" after "It is a", as vLLM gives it; alone it would read "truth"), and
    stop strings, min_tokens' floor and the tokens kept count in that text."""
    tok = metaspace_tokenizer(["It", "is", "a", "truth", "universally", "acknowledged", "that"])
    prompt, generated = tok("It is a").input_ids, tok("truth universally acknowledged that truth").input_ids
    for seed in range(3):
        detok = IncrementalDetokenizer(tok, prompt=prompt)
        pieces = stream_rounds(detok, generated, seed)
        assert "".join(pieces) == detok.text == " truth universally acknowledged that truth"
    assert IncrementalDetokenizer(tok).add(generated[:1]) == "truth"  # without the prompt: no space
    detok = IncrementalDetokenizer(tok, (" truth",), min_tokens=1, prompt=prompt)  # the first passed over
    detok.add(generated + tok("is a truth").input_ids)  # one round, going on past the stop string
    assert detok.stopped and detok.text == " truth universally acknowledged that"
    assert detok.tokens_through_stop() == 5  # up to the token that completed it


class CleaningTokenizer:
    """Pieces decoded as transformers 4.40-5.3 do where a tokenizer asks for clean_up_tokenization_spaces
    (Llama 3's): a space before "'s" or "!" dropped, unless told not to."""
    pieces = ["the", " word", " '", "social", "'", " !"]

    def decode(self, tokens, skip_special_tokens=False, clean_up_tokenization_spaces=True):
        text = "".join(self.pieces[t] for t in tokens)
        return text.replace(" 's", "'s").replace(" !", "!") if clean_up_tokenization_spaces else text


def test_spaces_are_not_cleaned_up_so_no_window_loses_a_character():
    """vLLM decodes without the clean-up; with it, a window whose text it shortened cut the next piece
    short (" word'social'" streamed as " word 'ocial'"), and the text differed from vLLM's."""
    for seed in range(4):
        detok = IncrementalDetokenizer(CleaningTokenizer(), prompt=[0])
        pieces = stream_rounds(detok, [1, 2, 3, 4, 5], seed)
        assert "".join(pieces) == detok.text == " word 'social' !"


def test_include_stop_str_in_output_keeps_the_stop_string(tiny_dir):
    """vLLM's include_stop_str_in_output: the text runs through the stop string, the pieces join to it,
    and the tokens kept are the same as without it (through the one that completed it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir("detok-words", tokenizer=True, vocab_size=40))
    tokens = [3 + (5 * i) % 37 for i in range(200)]
    whole = tokenizer.decode(tokens, skip_special_tokens=True)
    end = whole.index("w7 w12") + len("w7 w12")
    for seed in range(3):
        detok = IncrementalDetokenizer(tokenizer, ("w7 w12",), include_stop=True)
        pieces = stream_rounds(detok, tokens, seed)
        without = IncrementalDetokenizer(tokenizer, ("w7 w12",))
        stream_rounds(without, tokens, seed)
        assert detok.stopped and "".join(pieces) == detok.text == whole[:end]
        assert detok.tokens_through_stop() == without.tokens_through_stop() < len(tokens)
    # Nothing is held back while streaming (vLLM's: the stop string would be shown anyway), and a stop
    # string completed by a later round is still found.
    detok, shown = IncrementalDetokenizer(tokenizer, ("w7 w12",), include_stop=True), ""
    for token in tokens:
        shown += detok.add([token])
        assert shown == detok.text
        if detok.stopped:
            break
    assert detok.stopped and shown == whole[:end]


def test_special_tokens_are_left_out_unless_asked_for(tiny_dir):
    """skip_special_tokens (vLLM's, on by default): a special token's text is left out; off, it is kept."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir("detok-words", tokenizer=True, vocab_size=40))
    tokens = [5, 6, 1, 7, 2, 8]  # 1 and 2: <s> and </s>
    for skip, expected in ((True, "w5 w6 w7 w8"), (False, "w5 w6 <s> w7 </s> w8")):
        detok = IncrementalDetokenizer(tokenizer, skip_special=skip)
        assert "".join(stream_rounds(detok, tokens, 0)) == detok.text == expected


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_a_prompt_that_ends_inside_a_character_gets_the_whole_character(smollm2_tokenizer, seed):
    """Prompt ids cut inside an emoji's bytes (a completion continuing an answer cut by max_tokens): the
    first tokens complete it, and the output starts with the whole emoji (vLLM's), where slicing the window
    by the length of the prompt's U+FFFD-ended text dropped it, and the space after it."""
    tokens = smollm2_tokenizer("I say 😀 ok, and 日本語 again").input_ids
    cut = next(k for k in range(1, len(tokens)) if smollm2_tokenizer.decode(tokens[:k]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(smollm2_tokenizer, prompt=tokens[:cut])
    pieces = stream_rounds(detok, tokens[cut:], seed)
    assert "".join(pieces) == detok.text == "😀 ok, and 日本語 again"
    detok = IncrementalDetokenizer(smollm2_tokenizer, ("and",), prompt=tokens[:cut])
    stream_rounds(detok, tokens[cut:], seed)
    assert detok.text == "😀 ok, " and detok.tokens_through_stop() == len(smollm2_tokenizer("I say 😀 ok, and").input_ids) - cut


def test_overlapping_stop_strings_stop_where_one_token_at_a_time_would():
    """vLLM checks the stop strings after every token: it stops at those the earliest token completes, and of
    those at the first in `stop`. A round of several tokens (what speculation accepts at once) took the one
    that began first, so the same tokens stopped elsewhere, with another text, stop_reason and tokens kept,
    in another mode or with another gamma."""
    tok = metaspace_tokenizer(["hello", "world", "again"])
    tokens = tok("hello world again").input_ids
    for stop, text, reason, kept in ((("lo", "hello world"), "hel", "lo", 1),  # "lo" is completed first
                                     (("llo", "he"), "he", "llo", 1),  # one token completes both: list order
                                     (("he", "llo"), "", "he", 1),
                                     (("again", "ld"), "hello wor", "ld", 2)):
        for rounds in ([1, 1, 1], [3], [2, 1], [1, 2]):
            detok, at = IncrementalDetokenizer(tok, stop), 0
            for n in rounds:
                if not detok.stopped:
                    detok.add(tokens[at:at + n])
                at += n
            assert (detok.text, detok.stop_string, detok.tokens_through_stop()) == (text, reason, kept), (stop, rounds)


def test_byte_tokens_after_a_prompt_that_ends_in_them_and_stops_among_them_in_rounds_of_any_size():
    """A SentencePiece tokenizer with byte tokens (Llama 2's, Mistral's) decodes a whole run of them to
    U+FFFD where it begins inside a character. A prompt whose last 4 tokens did (it ends in two characters
    of 3 bytes the vocabulary lacks) made every window U+FFFD while the model went on in such characters
    (vLLM takes up to 24 prompt tokens for a clean context); and where a round ended inside a character,
    the length of its text shrank, so the tokens kept after a stop string, and min_tokens' floor, depended
    on how rounds cut the tokens (a stop at a newline kept 6 tokens instead of 3 in rounds of 4)."""
    tok = byte_fallback_tokenizer(["ab", "c"])
    prompt, whole = tok("ab\u2605\u2605").input_ids, tok("ab\u2605\u2605\u2605\u2605 c").input_ids
    assert whole[:len(prompt)] == prompt and "\ufffd" in tok.decode(prompt[-4:])
    for seed in range(3):
        detok = IncrementalDetokenizer(tok, prompt=prompt)
        assert "".join(stream_rounds(detok, whole[len(prompt):], seed)) == detok.text == "\u2605\u2605 c"
    whole = tok("ab\u2605\u2605 c").input_ids  # a prompt cut inside the second star: the output's, whole
    cut = next(k for k in range(len(whole), 0, -1) if tok.decode(whole[:k]).endswith("\ufffd"))
    for seed in range(3):
        detok = IncrementalDetokenizer(tok, prompt=whole[:cut])
        assert "".join(stream_rounds(detok, whole[cut:], seed)) == detok.text == "\u2605 c"
    tok = byte_fallback_tokenizer(["x", "y", "a"])  # a run of byte tokens longer than the context looked at
    whole = tok("x y" + "\U0001f600\u4e2d" * 5 + "a").input_ids
    cut = len(whole) - 2  # inside the last character, one byte short
    assert tok.decode(whole[:cut]).endswith("\ufffd")
    detok = IncrementalDetokenizer(tok, prompt=whole[:cut])
    assert detok.add(whole[cut:]) + detok.finish() == "\u4e2da"
    tok = byte_fallback_tokenizer(["ab", "c"])
    prompt = tok("c").input_ids
    for text, stops, min_tokens, expected in (("c\n\u2605c", ("\n",), 0, (" c", "\n", 3)),
                                              ("\u2605\u2605c", ("\u2605",), 5, (" \u2605", "\u2605", 7))):
        generated = tok(text, add_special_tokens=False).input_ids
        for size in range(1, len(generated) + 1):
            detok, at = IncrementalDetokenizer(tok, stops, min_tokens, prompt), 0
            while at < len(generated) and not detok.stopped:
                detok.add(generated[at:at + size])
                at += size
            detok.finish()
            assert (detok.text, detok.stop_string, detok.tokens_through_stop()) == expected, (text, size)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_output_cut_inside_a_character_ends_before_it(smollm2_tokenizer, seed):
    """max_tokens that ends the output inside a character (its first bytes' tokens, no more): the text leaves
    that character out, streamed or not, as vLLM's does (it ended in U+FFFD), and keeps its tokens."""
    tokens = smollm2_tokenizer("I say ok 日本語 again").input_ids
    cuts = [k for k in range(1, len(tokens)) if smollm2_tokenizer.decode(tokens[:k]).endswith("\ufffd")]
    assert cuts
    for cut in cuts:
        detok = IncrementalDetokenizer(smollm2_tokenizer)
        pieces = stream_rounds(detok, tokens[:cut], seed)
        ends = max(k for k in range(cut) if not smollm2_tokenizer.decode(tokens[:k]).endswith("\ufffd"))
        assert "".join(pieces) == detok.text == smollm2_tokenizer.decode(tokens[:ends])  # (a space before the
        assert detok.kept_ids() == tokens[:cut] and "\ufffd" not in detok.text  # character is in its token)


def test_byte_tokens_cut_inside_a_character_end_before_it():
    """The same with SentencePiece's byte tokens, whose run decodes wholly to U+FFFD where a character in it is
    cut: the complete characters before the cut stay."""
    tok = byte_fallback_tokenizer(["ab", "c"])
    tokens = tok("c\u2605\u2605", add_special_tokens=False).input_ids
    assert tok.decode(tokens[:-1]).endswith("\ufffd")
    for size in range(1, len(tokens)):
        detok, at = IncrementalDetokenizer(tok), 0
        pieces = []
        while at < len(tokens) - 1:
            pieces.append(detok.add(tokens[at:min(at + size, len(tokens) - 1)]))
            at += size
        pieces.append(detok.finish())
        assert "".join(pieces) == detok.text == "c\u2605", size
