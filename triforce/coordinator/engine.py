"""The hierarchy loop: any number of tiers, cheapest first, each checking the one below exactly.

All tiers share one token sequence `seq` (prompt, committed tokens, then speculative ones). A tier's
cache holds KV for a prefix `seq[:tier.length]`; a forward feeds `seq[tier.length:]`, so a tier that
lags (say the draft, after its last proposal was accepted) simply catches up. When a check at position p
keeps `a` of its proposals, `seq` is cut to p + a and the new token appended, and every tier keeps
only the valid prefix p + a. After each target check, `sync` lets the retrieval cache replace
its speculative KV with the target's.

`_produce(level, n)` returns at least n tokens sampled exactly from tier `level`'s distribution, with
that tier's probabilities at each: tier 0 samples autoregressively (as a proposer it may end a chain
early: `stop_below`); any higher tier repeatedly takes `gammas[level - 1]` tokens from the tier below
and verifies them (speculation/verify.py; the run yields a `Check`, so that a batch verifies all
its sequences' chains in one call), except that with a `TreeShaper` tier 1 checks a token tree that
tier 0 grows (Sequoia; coordinator/trees.py, speculation/tree.py) in one forward. A tier above tier 1
checks every token of the rounds below: of a fixed number of them (`rounds_per_check`), or of as many
as reach its gamma (`_check_chain`). After a tree check every cache keeps the accepted path of its tree
entries (`keep_path`); a chain's path is its accepted prefix. The output is one round of
`_produce(top, 1)` after another. Every random draw is made here, with the request's own generator.

An engine serves one sequence (its tiers hold that sequence's caches). `run` is that sequence's whole
request as a generator that yields each forward it needs (`Forward`: which tier, which step; runs.py) and
is sent the logits back, so that a `SequenceBatch` (batch.py) can run the same forward of many sequences as one
model call; `generate` runs one request alone. Nothing a sequence decides depends on another's.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Generator

import torch

from ..sampling_params import SamplingParams
from ..logprobs import TokenLogprobs, token_logprobs
from ..speculation.guided import Guide
from ..speculation.lookup import ContextLookup
from ..speculation.rules import RowRules, check_obeyed
from ..speculation.sampling import sample, top_probability, unseeded_generator
from ..speculation.tree import children_of, verify_tree
from ..step import Step
from .metrics import RequestMetrics, TierStats
from .prefill import TierPrefill
from .request_rows import RequestRows
from .runs import Check, Forward, Produced, Run
from .tiers import Tier, settle
from .trees import TreeShaper, grow_tree, measure_above, measure_costs, node_paths, tree_step

PROGRESS_MIN_TOKENS = 2048  # show a prefill progress bar for prompts at least this long
# Tokens a constraint forces that a tier takes without a forward, while it and the tiers below lag the
# sequence by fewer than this (their next forwards catch them up: hierarchy.speculation_slack)
FORCED_LAG = 8


class HierarchyEngine(TierPrefill):
    def __init__(self, tiers: list[Tier], gammas: list[int], tree: TreeShaper | None = None, lookup: int = 0,
                 stop_below: float = 0.0, rounds_per_check: int = 0):
        """tree: the shape policy when the bottom tier proposes trees to the tier above (else chains).
        lookup: n > 0 mixes copies of the sequence's own n-grams into the bottom tier's proposals, chains
        and trees (speculation/lookup.py). stop_below: the bottom tier's chains end after a proposal its model was
        less sure of than this (`_produce`). rounds_per_check: n > 0, a tier above tier 1 checks what n checks
        of the tier below made (0: as many checks as make its gamma of tokens; `_check_chain`; a token a
        constraint forced, which takes no check, counts as one: speculation_slack holds one FORCED_LAG)."""
        if len(gammas) != len(tiers) - 1 or any(g < 1 for g in gammas):
            raise ValueError("need one gamma >= 1 per pair of adjacent tiers")
        if rounds_per_check < 0:
            raise ValueError("rounds_per_check must be >= 0")
        if tree is not None and len(tiers) < 2:
            raise ValueError("a tree needs a tier to check it")
        self.tiers, self.gammas, self.tree, self.lookup_n = tiers, gammas, tree, lookup
        self.stop_below, self.rounds_per_check = stop_below, rounds_per_check
        self.went_on: list[bool] = []  # (`_produce`)
        # Without stop_below, a threshold at which the bottom tier's chains, running on to their gamma, note
        # where a stopping chain would have ended (`went_on`, as far as its first unsure token): what mode
        # auto's plans that stop chains are predicted from, learned where its plan does not stop them (auto.py)
        self.stop_watch = 0.0
        self.rows: RequestRows | None = None  # what the request makes of its tiers' rows, from `run`
        self.guide: Guide | None = None  # the request's structured-output constraint, from `run`
        self.prompt_length: int | None = None  # the request's, from `run`
        self.forced_at: set[int] = set()  # positions of `seq` whose token a constraint forced (no forward)
        self.logprobs: list[TokenLogprobs] = []  # per generated token, when the request asks (SamplingParams.logprobs)
        self.prompt_logprobs: list[TokenLogprobs | None] = []  # per prompt token (the first: None), when asked
        self.ladder = list(tiers)  # every tier this engine may run, cheapest first (a Forward's level)

    def generate(self, prompt: list[int], params: SamplingParams, stop_ids: tuple[int, ...] = (),
                 on_tokens: Callable[[list[int]], bool] | None = None, show_progress: bool = False,
                 guide: Guide | None = None) -> tuple[list[int], RequestMetrics]:
        """Runs one request alone: see `run`."""
        from .batch import SequenceBatch

        batch = SequenceBatch()
        handle = batch.add(self.run(prompt, params, stop_ids, on_tokens, show_progress, guide=guide))
        batch.run()
        return handle.result

    @property
    def prefilled(self) -> bool:
        """Whether its target holds its prompt: before, its prompt chunks ride on a batch's target forwards
        (mode auto), and a request cancelled then is cut short whatever its max_tokens."""
        return self.prompt_length is not None and self.ladder[-1].length >= self.prompt_length - 1

    def run(self, prompt: list[int], params: SamplingParams, stop_ids: tuple[int, ...] = (),
            on_tokens: Callable[[list[int]], bool] | None = None, show_progress: bool = False,
            cancelled: Callable[[], bool] | None = None, guide: Guide | None = None) -> Run:
        """The request as a generator of forwards; returns (generated token ids, metrics). `on_tokens` sees
        each round's new tokens and returns True to stop (stop strings); generation also stops at a stop id
        or after max_tokens. `cancelled` is asked between prefill chunks: True ends the request there
        with no tokens (a long prompt's client that went away frees the batch at once). `guide`: the
        request's structured_outputs constraint (speculation/guided.py; Grammars.guide makes it)."""
        if not prompt:
            raise ValueError("empty prompt")
        self.params = params
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else unseeded_generator()
        self.seq, self.forced_at = list(prompt), set()
        ends = params.end_ids(stop_ids) | (guide.eos if guide is not None else frozenset())
        self.rows = RequestRows(params, self.seq, generator,
                                RowRules.of(params, prompt, set(params.stop_token_ids) | set(stop_ids), guide),
                                ContextLookup(self.lookup_n) if self.lookup_n else None)
        self.guide, self.prompt_length = guide, len(prompt)
        allowed = None if params.allowed_token_ids is None else frozenset(params.allowed_token_ids)
        self.logprobs = []
        self.prompt_logprobs = [] if params.prompt_logprobs is None else [None]
        self.stats = [TierStats(t.name, self.tiers[i - 1].name) for i, t in enumerate(self.tiers) if i > 0]
        metrics = RequestMetrics(prompt_tokens=len(prompt), tiers=list(self.stats))

        start = time.perf_counter()
        prefilled = yield from self._prefill(prompt[:-1], show_progress and len(prompt) >= PROGRESS_MIN_TOKENS,
                                             cancelled or (lambda: False))
        if not prefilled:
            metrics.prefill_s = time.perf_counter() - start
            return [], metrics
        if self.tree is not None and self.tree.needs_costs and params.max_tokens:  # forward costs here, at this context
            self.tree.costs = measure_costs(self.tiers[1], self.tiers[0], self.tree.largest + 1)
            if len(self.tiers) > 2 and isinstance(self.tree, TreeShaper):  # (confidence trees do not model it)
                self.tree.above = measure_above(self.tiers[2], self.gammas[1], self.rounds_per_check, self.tree.largest)
        settle(self.ladder)  # (on a GPU the prefill's work was still queued: it fell in the first decode step)
        metrics.prefill_s = time.perf_counter() - start
        metrics.cached_prompt_tokens = self.ladder[-1].reused_tokens
        self._advance_lookup()
        for tier in self.ladder:
            tier.seconds = 0.0

        start = time.perf_counter()
        generated: list[int] = []
        while len(generated) < params.max_tokens:
            yield from self._before_round(len(generated), metrics)
            new, rows, logits = yield from self._produce(len(self.tiers) - 1, 1)
            for tier in self.tiers:
                tier.sync()
            committed = len(self.seq) - len(new)  # where the top tier's round began
            new = new[: params.max_tokens - len(generated)]
            stop_at = next((i for i, t in enumerate(new) if t in ends), None)
            if stop_at is not None:
                new = new[: stop_at + 1]
            if self.rows.rules is not None or allowed is not None:
                check_obeyed(self.rows.rules, allowed, self.seq, committed, committed + len(new), self.prompt_length)
            self._emitted(new, rows[: len(new)])
            if params.logprobs is not None:
                self.logprobs += token_logprobs(logits[: len(new)], new, params.logprobs)
            generated += new
            self._advance_lookup()
            stopped = on_tokens is not None and on_tokens(new)  # the round that ends it is shown too
            if stop_at is not None or stopped:
                break
        metrics.decode_s = time.perf_counter() - start
        metrics.generated_tokens = len(generated)
        for stat in metrics.tiers:
            stat.seconds = next(t.seconds for t in self.ladder if t.name == stat.name)
        metrics.retrieval_rebuilds = sum(t.rebuilds for t in self.ladder)
        metrics.lookup = None if self.rows.lookup is None else self.rows.lookup.to_dict()
        return generated, metrics

    def _advance_lookup(self) -> None:
        """Between rounds all of `seq` is final (the top tier committed it): the lookup indexes it."""
        if self.rows.lookup is not None:
            self.rows.lookup.advance(self.seq, len(self.seq))

    def _before_round(self, generated: int, metrics: RequestMetrics) -> Generator[Forward, None, None]:
        """Called before each round of the top tier (an engine that re-plans its tiers overrides it)."""
        yield from ()

    def _emitted(self, tokens: list[int], rows: list[torch.Tensor]) -> None:
        """Told each round's output tokens and the target's distribution at each (an engine that learns
        from them overrides it)."""

    def _forward(self, level: int, step: Step | None = None) -> Generator[Forward, torch.Tensor, torch.Tensor]:
        """Tier `level` runs `step` (by default: catches up with `seq`); returns its logits [n, V]."""
        tier = self.tiers[level]
        step = step or Step.chain(self.seq[tier.length:], tier.length)
        return (yield Forward(tier, self.ladder.index(tier), step))

    def _produce(self, level: int, count: int, rounds: int = 0) -> Produced:
        """At least `count` tokens sampled exactly from tier `level`, with that tier's distribution and its
        model's logits for each; with `rounds` > 0 instead what that many of its rounds (one token each at
        the bottom tier, one check above it) make, however many tokens that is.

        As a proposer (below the target) the bottom tier may return fewer: with `stop_below`, it ends its
        chain after a token whose row its model gave a top probability, at temperature 1, below that (a
        proposal unlikely to survive, and the ones after it less likely still), so that the check holds
        fewer tokens; not after the prompt lookup's copy, which is as sure as the lookup's record, not as
        the model. Sampling stays exact: where a chain ends is decided from the proposer's own state
        before the checker sees the chain, and verification is exact for a chain of any length (each
        position's accept-or-resample rule reads only the two tiers' rows there; the check draws the token
        after the chain from the checker)."""
        seq, greedy = self.seq, self.params.greedy
        proposing = len(self.tiers) > 1  # the bottom tier proposes to a tier above (not the target alone)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []  # tier `level`'s distribution for each returned token, [V] each
        raw: list[torch.Tensor] = []  # and its logits there
        stop_below = self.stop_below if proposing else 0.0
        watch = stop_below or (self.stop_watch if proposing else 0.0)
        if level == 0:  # with stop_below, whether the chain went on past each token it samples (mode auto
            self.went_on = []  # learns how often, and how its tokens fare either way; or would have: stop_watch)
        made = 0  # rounds
        while made < rounds if rounds else len(tokens) < count:
            made += 1
            if (forced := self._forced(level)) is not None:  # no forward (nor, above the bottom, a check) needed
                self.forced_at.add(len(seq))
                seq.append(forced[0])
                tokens.append(forced[0])
                probs.append(forced[1])
                raw.append(forced[1].log())
                continue
            if level == 0:
                logits = (yield from self._forward(0))[-1]
                ruled = self.rows.ruled(logits[None], [[]])
                row = self.rows.probs(ruled)[0]
                copy = self.rows.copy([], ruled[0]) if proposing else None
                row = self.rows.mixed(row, copy, []) if proposing else row
                token = sample(row, self.rows.generator, greedy, proposal=proposing)
                seq.append(token)
                tokens.append(token)
                probs.append(row)
                raw.append(logits)
                if watch and (not self.went_on or self.went_on[-1]):  # (up to the first token it stops at)
                    # (a row whose top probability is NaN, a +inf logit, goes on, as it always did)
                    self.went_on.append(token == copy or not top_probability(logits) < watch)
                    if stop_below and not self.went_on[-1]:
                        break
                continue
            check = self._check_tree() if level == 1 and self.tree is not None else self._check_chain(level)
            new, rows, logits = yield from check
            tokens += new
            probs += rows
            raw += logits
        return tokens, probs, raw

    def _forced(self, level: int) -> tuple[int, torch.Tensor] | None:
        """(token, its one-hot distribution) where the request's constraint allows only that token next
        (Guide.forced): every tier's row there is that one-hot whatever its logits, so tier `level` takes it
        without a forward or a check of the tiers below (their next forwards catch up), while none of them
        lags by FORCED_LAG tokens (a tier above holds it as a proposal of its round). None elsewhere, and
        where the request asks for log-probabilities (they need the target's logits). (A forced token that
        allowed_token_ids or a bad word leave out is where the rules contradict each other: the round that
        outputs it ends the request, rules.check_obeyed.)"""
        if self.guide is None or self.params.logprobs is not None:
            return None
        if max(len(self.seq) - t.length for t in self.tiers[:level + 1]) >= FORCED_LAG:
            return None
        token = self.guide.forced(self.seq[self.prompt_length:])
        if token is None:
            return None
        row = torch.zeros(self.guide.vocab_size)  # on the CPU, as every tier's rows are (tiers.py)
        row[token] = 1.0
        return token, row

    def _check_chain(self, level: int) -> Produced:
        """Tier `level` checks a chain of tokens from the tier below: gamma of them (fewer where the bottom
        tier stopped early), or more where that tier's rounds overshot gamma; above tier 1 with
        `rounds_per_check`, what that many rounds made."""
        position = len(self.seq)
        # The tier below may overshoot: above tier 1, whose checks yield up to their accepted length + 1
        # tokens each, its rounds stop past gamma. Those extra tokens are exact samples of the tier below
        # like the first gamma, and checking them costs the tier above little (a check of a few tokens
        # more costs about what one does), while dropping them threw away a third of tier 1's output
        # (docs/trees.md). So a check takes them all (mode auto's planner models that:
        # speed_model.check_sizes). Exact: how many tokens a check holds is decided by the rounds below
        # before this tier sees any of them (a stopping time, as `stop_below`).
        # A fixed number of rounds is one too. In a batch it keeps every sequence's forwards in step: by
        # tokens, a sequence whose rounds made few must run more while its batchmates wait at this tier,
        # and those calls of a few sequences cost about what calls of all of them do (docs/batches.md).
        g = self.gammas[level - 1]
        rounds = self.rounds_per_check if level >= 2 else 0
        draft_tokens, draft_rows, _ = yield from self._produce(level - 1, g, rounds)
        g = len(draft_tokens)  # fewer where the bottom tier ended its chain early (stop_below), or more
        logits = (yield from self._forward(level))[-(g + 1):]  # [g + 1, V]
        penalized = self.rows.ruled_chain(logits, position)  # seq[position:] holds the draft tokens
        verdict, target_probs = yield Check(draft_tokens, torch.stack(draft_rows), penalized, self.params,
                                            self.rows.generator, proposal=level < len(self.tiers) - 1)
        if verdict.failed is not None:  # the target's row for the next token is not finite: this request ends
            raise verdict.failed
        # A token the constraint forced is no proposal: every tier's row there is its one-hot, so it was
        # accepted whatever the proposer (counted, the acceptance near 1 under a schema of fixed keys, and a
        # retrieval tier's falling acceptance, which makes it rebuild, hidden)
        forced = [position + i in self.forced_at for i in range(g)] if self.forced_at else []  # (none: no walk)
        self._record(level, g - sum(forced), verdict.accepted - sum(forced[:verdict.accepted]))
        out = self._commit(position, draft_tokens, list(range(verdict.accepted)), verdict.next_token)
        kept = verdict.accepted + 1
        return out, list(target_probs[:kept]), list(logits[:kept])

    def _check_tree(self) -> Produced:
        """Tier 1 checks a tree that tier 0 grows (Sequoia) in one forward."""
        proposer, checker, greedy = self.tiers[0], self.tiers[1], self.params.greedy
        position = len(self.seq)
        tokens, parents, draft_probs = yield from grow_tree(proposer, lambda step: self._forward(0, step),
                                                            self.tree.growth(), self.rows)
        step = tree_step(self.seq, checker.length, tokens, parents)
        catch_up = step.n - len(tokens)
        logits = (yield from self._forward(1, step))[catch_up - 1:]  # [N + 1, V]: root, nodes
        target_probs = self.rows.probs(self.rows.ruled(logits, [[]] + node_paths(tokens, parents)))
        verdict = verify_tree(tokens, parents, draft_probs, target_probs, self.rows.generator, greedy,
                              proposal=len(self.tiers) > 2)
        accepted = len(verdict.path)
        self.tree.observe(parents, verdict.path)
        self.stats[0].record(len(tokens), accepted)
        # The proposer's own bookkeeping sees the walk as a chain: its accepted nodes, then one rejection
        # unless the walk ended at a leaf.
        last_slot = verdict.path[-1] + 1 if verdict.path else 0
        proposer.observe(accepted + (1 if children_of(parents)[last_slot] else 0), accepted)
        out = self._commit(position, tokens, verdict.path, verdict.next_token)
        rows = [0] + [i + 1 for i in verdict.path]
        return out, [target_probs[r] for r in rows], [logits[r] for r in rows]

    def _record(self, level: int, proposed: int, accepted: int) -> None:
        """A chain check at `level` accepted `accepted` of the `proposed` tokens from the level below."""
        self.stats[level - 1].record(proposed, accepted)
        self.tiers[level - 1].observe(proposed, accepted)  # how the proposer's tokens fared

    def _commit(self, position: int, proposals: list[int], path: list[int], next_token: int) -> list[int]:
        """After a check of proposals that followed `seq[:position]`: `seq` continues with the accepted path
        and the next token (returned), and every cache keeps, of its entries past `position` (proposals in
        node order), those on the path."""
        out = [proposals[i] for i in path] + [next_token]
        if self.forced_at:  # (the path's are as they were)
            self.forced_at = {p for p in self.forced_at if p < position + len(path)}
        del self.seq[position:]
        self.seq += out
        for t in self.tiers:
            held = t.length - position
            if held > 0:
                t.keep_path(position, [p for p in path if p < held])
        return out
