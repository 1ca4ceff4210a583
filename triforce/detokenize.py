"""Text of a growing list of generated tokens, at a cost per round that does not grow with the output.

Decoding the whole output again every round is quadratic in its length. `IncrementalDetokenizer` decodes
only a short window: the tokens since the last piece it emitted, plus the tokens of that piece as context
(vLLM's prefix and read offsets). Context matters because a tokenizer may render a token differently
at the start of a text (a SentencePiece word marker loses its space there): so the first window is
decoded after the prompt's last few tokens, and the text is what the prompt is followed by (" Paris" after
"The capital of France is", as vLLM gives it, not "Paris"). A window whose text ends in U+FFFD is held
back, since the next tokens may complete a multibyte character; `finish` leaves a character that no token
completed out of the text, its tokens kept, as vLLM does (max_tokens cut the output inside it).

Stop strings are searched in the new text and the len(longest stop) - 1 characters before it, so a stop
string that two rounds complete between them is found; while none is found, those last characters are not
handed out, so no part of one is ever streamed (with `include_stop`, which keeps it, they are). The output keeps the tokens up to
the one that completed it (`tokens_through_stop`). With min_tokens, a stop string that ends within the
text of the first min_tokens tokens does not count (vLLM looks for none before then). The token that
ended generation (end-of-sequence, a stop token id) is kept, its text left out, as vLLM does; with
`include_stop` (vLLM's include_stop_str_in_output) the text keeps the stop string, and the caller passes
the ending token as an ordinary one. `skip_special` leaves special tokens' text out (vLLM's
skip_special_tokens, on by default).
"""
from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"
DECODE_CONTEXT = 4  # tokens before a piece of text that it is decoded after (the prompt's, first)...
MAX_PROMPT_CONTEXT = 24  # ...or, where the prompt's last 4 begin inside a character, up to this many (vLLM's)
MAX_PARTIAL = 3  # tokens an incomplete character's bytes take at most (3 of UTF-8's 4, a token each or fewer)


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stops: tuple[str, ...] = (), min_tokens: int = 0, prompt: Sequence[int] = (),
                 include_stop: bool = False, skip_special: bool = True):
        """prompt: the request's prompt (its last DECODE_CONTEXT tokens are the first window's context)."""
        self.tokenizer, self.stops, self.min_tokens = tokenizer, stops, min_tokens
        self.include_stop, self.skip_special = include_stop, skip_special
        self._context = self._prompt_context(list(prompt))
        self._context_chars = len(self._decode(self._context))
        self._floor: int | None = None if min_tokens else 0  # characters of the first min_tokens tokens' text
        self.tokens: list[int] = []
        self.text = ""  # the text decoded so far, cut before the first stop string
        self.stopped = False  # a stop string was found
        self.stop_string: str | None = None  # which
        self._shown = 0  # characters of `text` handed out so far
        # A stop string may begin in the last len(longest stop) - 1 characters before a round's text: they
        # are searched again. While no stop string is found they wait, as the start of a stop string that
        # the next round completes would be taken back; kept in the text (include_stop), they need not.
        self._reach = max((len(s) for s in stops), default=1) - 1
        self._hold = 0 if include_stop else self._reach
        self._prefix = 0  # first token of the context window
        self._read = 0  # first token not yet decoded into `text`
        self._stop_end = 0  # where the stop string found ends in the decoded text
        self._kept: int | None = None  # tokens_through_stop, once found
        self._end: int | None = None  # the token that ended generation, not decoded

    def _decode(self, tokens: list[int]) -> str:
        # no clean-up (Llama 3's tokenizers ask for it, and transformers 4.40-5.3 do it: " !" -> "!"), as
        # vLLM's incremental decoding: text differed from vLLM's, and a window shortened by it cut
        # characters off the next piece (" word'social'" came out " word 'ocial'")
        return self.tokenizer.decode(tokens, skip_special_tokens=self.skip_special, clean_up_tokenization_spaces=False)

    def _prompt_context(self, prompt: list[int]) -> list[int]:
        """The prompt's last DECODE_CONTEXT tokens, or the fewest past them (up to MAX_PROMPT_CONTEXT) whose
        text has no U+FFFD: a SentencePiece tokenizer with byte tokens (Llama 2's, Mistral's) decodes a
        whole run of them to U+FFFD where it begins or ends inside a character, complete characters too,
        and every window after a context that began inside one stayed U+FFFD while the run went on."""
        n = len(prompt)
        # Where it ends inside a character (which the output's first tokens complete), or holds a U+FFFD of its
        # own: the fewest tokens whose text before that character's `tail` tokens has none, with them
        for tail in range(min(n, MAX_PARTIAL) + 1):  # (a window of the prompt: never all of it)
            for k in range(max(DECODE_CONTEXT, tail + 1), min(n, MAX_PROMPT_CONTEXT) + 1):
                if REPLACEMENT not in self._decode(prompt[n - k:n - tail]):
                    return prompt[n - k:]
        return prompt[-DECODE_CONTEXT:]

    def add(self, new: list[int], end: int | None = None) -> str:
        """Takes a round's new tokens, and the token that ended generation after them if one did (kept
        among the output's tokens, not decoded); returns the text that is now final ('' while held back)."""
        self.tokens += new
        self._end = end
        if not self.stopped:
            self._decode_window(final=False)
        return self._take(final=self.stopped)

    def finish(self) -> str:
        """After the last round: the rest of the text (held-back characters, an incomplete character)."""
        if not self.stopped:
            self._decode_window(final=True)
        return self._take(final=True)

    def _after_prompt(self, start: int, end: int | None = None) -> list[int]:
        """Generated tokens [start:end], after the prompt's context where they begin the text."""
        return (self._context if start == 0 else []) + self.tokens[start:end]

    def _chars(self, n: int) -> int:
        """The length of the first n generated tokens' text, up to the last of them that ends a character: it
        grows with n (_tokens_reaching bisects it). (Without an incomplete character's U+FFFD at the end, as
        before, it shrank where byte tokens decode a whole run to U+FFFD, complete characters too: a stop
        string then kept other tokens, or counted within min_tokens, by how a round cut the tokens.)"""
        return max(0, self._complete_chars(self._context + self.tokens[:n]) - self._context_chars)

    def _complete_chars(self, tokens: list[int]) -> int:
        """The length of `_complete_text(tokens)`."""
        return len(self._complete_text(tokens))

    def _complete_text(self, tokens: list[int]) -> str:
        """The text of `tokens` up to the last of them that ends a character: up to MAX_PARTIAL tokens back;
        past that the U+FFFD is the text's (a literal one, or bytes that no character ends), and stays."""
        for back in range(min(len(tokens), MAX_PARTIAL) + 1):
            text = self._decode(tokens[:len(tokens) - back])
            if not text.endswith(REPLACEMENT):
                return text
        return self._decode(tokens)

    def _decode_window(self, final: bool) -> None:
        context = self._decode(self._after_prompt(self._prefix, self._read))
        window = self._decode(self._after_prompt(self._prefix))
        if final and window.endswith(REPLACEMENT):  # (max_tokens cut the output inside a character: it goes,
            window = self._complete_text(self._after_prompt(self._prefix))  # as vLLM's does, its tokens kept)
        cut = len(context)
        if self._read == 0 and context.endswith(REPLACEMENT) and not window.startswith(context):
            # The prompt ends inside a character that the first tokens complete (its bytes so far decoded
            # to U+FFFD): the whole character is the output's, as vLLM gives it; the text before is the
            # prompt's: what the window begins with as the context did (a byte-level BPE's bytes of a
            # token before the character's), or the text of its tokens up to the last that ends a
            # character (SentencePiece's byte tokens decode a whole run to U+FFFD, its complete
            # characters too). A literal U+FFFD the prompt ends with stays in the window, and the prompt's.
            same = next((i for i, (a, b) in enumerate(zip(context, window)) if a != b), len(context))
            cut = self._context_chars = max(same, self._complete_chars(self._context))
        if len(window) <= cut or (window.endswith(REPLACEMENT) and not final):
            return
        self._prefix, self._read = self._read, len(self.tokens)
        start = len(self.text)
        self.text += window[cut:]
        if self._floor is None:
            if len(self.tokens) < self.min_tokens:
                return
            self._floor = self._chars(self.min_tokens)
        region = max(0, start - self._reach)
        hits = [hit for hit in (self._first_after_floor(s, region) for s in self.stops) if hit is not None]
        if hits:
            at, self._stop_end, self.stop_string = self._first_completed(hits)
            self.text, self.stopped = self.text[:self._stop_end if self.include_stop else at], True

    def _first_completed(self, hits: list[tuple[int, int, str]]) -> tuple[int, int, str]:
        """Of the stop strings found in a round's text (in the order of `stop`), the one vLLM stops at,
        checking after every token: of those the earliest token completes, the first in `stop`. (The one
        that began first was taken: a round of several tokens, as speculation accepts them, then stopped
        elsewhere than one token at a time, with another text, stop_reason and tokens.)"""
        if len(hits) > 1:
            first = min(hits, key=lambda hit: hit[1])
            self._kept = self._tokens_reaching(first[1])
            reach = self._chars(self._kept)
            return next((hit for hit in hits if hit[1] <= reach), first)  # (a text the tokens' decode does
            # not reach as the windows built it: the one that ends first)
        return hits[0]

    def _tokens_reaching(self, end: int) -> int:
        """The least n whose first n generated tokens' text reaches `end` characters."""
        low, high = 1, len(self.tokens)
        while low < high:
            mid = (low + high) // 2
            if self._chars(mid) >= end:
                high = mid
            else:
                low = mid + 1
        return low

    def _first_after_floor(self, stop: str, region: int) -> tuple[int, int, str] | None:
        """(start, end, stop) of the first `stop` at or after `region` that ends past the floor."""
        at = self.text.find(stop, region)
        while at >= 0 and at + len(stop) <= self._floor:
            at = self.text.find(stop, at + 1)
        return None if at < 0 else (at, at + len(stop), stop)

    def kept_ids(self, start: int = 0) -> list[int]:
        """The ids of the tokens the output keeps (tokens_through_stop), from `start` on."""
        end = self.tokens_through_stop()
        ids = self.tokens[start:end]
        return ids + [self._end] if end > len(self.tokens) and start <= len(self.tokens) else ids

    def tokens_through_stop(self) -> int:
        """How many of the tokens the output keeps: all, or, once a stop string was found, those up to
        the one that completed it (the round that produced it may have gone on), as vLLM keeps them."""
        if not self.stopped:
            return len(self.tokens) + (self._end is not None)
        if self._kept is None:
            self._kept = self._tokens_reaching(self._stop_end)
        return self._kept

    def _take(self, final: bool) -> str:
        end = len(self.text) if final else max(self._shown, len(self.text) - self._hold)
        piece, self._shown = self.text[self._shown:end], end
        return piece
