"""What earlier requests taught `--mode auto` about a model pair on this machine, so that a new request's
first plan starts from it instead of generic guesses.

For each kind of request (the machine; each tier's kind and the fingerprint of its model's weights; the
sampling settings, since acceptance depends on the temperature; the batch size planned for),
`priors-5.json` beside the costs holds:
- `acceptance`: per proposer, the per-token acceptance its checks saw lately (the draft's, the retrieval
  tier's), and where its chains end early how often they went on past a token and how its tokens fared,
  sure or not (speed_model.STOP_RATES); the planner takes it as its prior, worth LEARNED_TRIALS trials (a
  generic prior is worth fewer: the planner explores less where it already knows);
- `realized`: per mode, the speed reached over the speed the cost model predicted (planning.py), as last
  measured;
- `overhead`: per tier and role (in any mode, and in each mode apart), the seconds from one of its forwards
  to the next past the model's (forward_times.py: `observe_overhead`), as last measured.
A request that ends merges its own into the entry, as the file holds it then (processes that share the
file, a server and a bench, merge into one another's): acceptance by an even average with what was there, so
that one odd text does not erase the history; a realized factor replaced by the newest. What a request did
not see enough of (a proposer it checked less than MIN_TRIALS times, a mode it did not run) drifts back
halfway towards the generic prior (a factor of 1), so a tier that a bad stretch made look poor is tried
again a few requests later instead of being locked out by its own record; a request that holds no mode's
speed factor of its own (a batch member that ran its leader's plans) leaves the factors as they are. The
request's own checks then decide as before, from a remembered acceptance worth LEARNED_TRIALS trials where
there is one. A kind none ran yet starts from the speed factors of its kin, kinds that differ from it only
in their sampling settings (`Priors.recall`).
"""
from __future__ import annotations

import hashlib
import time

from ..cache.streaming import StreamingKVCache
from ..sampling_params import SamplingParams
from .calibration import CalibrationFile, finite_numbers
from .costs import machine_key, tier_key
from .tiers import Tier

LEARNED_TRIALS = 12.0  # what a remembered acceptance is worth, in checks of one token
MIN_TRIALS = 4.0  # a request remembers a proposer's acceptance only after this much evidence
NEW_WEIGHT = 0.5  # a request's acceptance against what earlier ones left
DRIFT = 0.5  # how far what a request did not see moves back towards the generic prior
# Kinds the file keeps, those remembered last: a server's requests that each bring their own JSON schema
# or logit bias are each a kind, and the file grew by one entry per request, rewritten whole at each save
MAX_KINDS = 512
_clock = time.time  # when an entry was last remembered ("seen")


def weights_key(model) -> str:
    """A short fingerprint of a model's weights (a few rows of its embedding and output head), so that two
    checkpoints of one shape are told apart; computed once per model."""
    if not hasattr(model, "_weights_key"):
        digest = hashlib.sha256()
        for weight in (model.embed_tokens.weight, model.lm_head.weight):
            weight = getattr(weight, "q", weight)  # (an int8 twin's head: its int8 rows, models/quantized.py)
            digest.update(weight[:8].detach().float().cpu().numpy().tobytes())
        model._weights_key = digest.hexdigest()[:16]
    return model._weights_key


def request_key(ladder: list[Tier], params: SamplingParams, batch: int = 1, lookup: int = 0,
                stop_below: float | None = None, context: int | None = None) -> str:
    """The kind of request: machine, tiers (kind and weights), sampling settings (a logit bias, allowed
    token ids, bad words and a constraint by their hashes), the batch size it
    plans for (a mode's speed against its model differs with it), the prompt lookup's n (it changes
    what the bottom tier proposes), a stop_below the user fixed (it changes which proposals are
    checked; None, the planner's choice, is the same on one machine) and the context's power of two
    (Qwen2.5-Coder's draft was accepted 0.79 of the time after 8K tokens and 0.10 after 32K: a 32K
    request that started from the 8K requests' acceptance opened with a long draft chain)."""
    tiers = "|".join(f"{tier_key(t)}@{weights_key(t.model)}{_proposes_by(t)}" for t in ladder)
    sampling = "greedy" if params.greedy else f"t={params.temperature:.2f},p={params.top_p:g},k={params.top_k}" + (
        f",min_p={params.min_p:g}" if params.min_p else "")
    if params.logit_bias:  # it changes every tier's rows, so how often they agree
        sampling += f",bias={_hash(params.logit_bias)}"
    if params.penalized:  # likewise
        sampling += f",penalties={params.presence_penalty:g}/{params.frequency_penalty:g}/{params.repetition_penalty:g}"
    if params.structured_outputs is not None:  # likewise: the constraint masks every tier's rows
        sampling += f",guided={_hash(params.structured_outputs)}"
    for name, value in (("allowed", params.allowed_token_ids), ("banned", params.bad_words_ids)):  # likewise
        if value:
            sampling += f",{name}={_hash(value)}"
    machine = "+".join(sorted({machine_key(str(t.model.device)) for t in ladder}))
    return (f"{machine}||{tiers}||{sampling}" + (f"||batch={batch}" if batch > 1 else "")
            + (f"||lookup={lookup}" if lookup else "") + (f"||stop={stop_below:g}" if stop_below is not None else "")
            + (f"||context={1 << (context.bit_length() - 1)}" if context else ""))


def kin(key: str) -> str:
    """A request key without its sampling settings (request_key's third part): what kinds share whose speed
    factors are alike."""
    parts = key.split("||")
    return "||".join(parts[:2] + parts[3:])


def _proposes_by(tier: Tier) -> str:
    """What else a tier's rows depend on beyond its weights and cache budget: its RoPE scaling (yarn:4 at
    16K reads positions otherwise) and a streaming cache's sinks and window (a draft's)."""
    scaling = tier.model.config.rope_scaling
    cache = getattr(tier, "cache", None)
    window = f"|stream={cache.sinks}+{cache.window}" if isinstance(cache, StreamingKVCache) else ""
    return (f"|rope={_hash(sorted(scaling.items()))}" if scaling else "") + window


def _hash(value) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:8]


class Priors(CalibrationFile):
    """Entries "request key" -> {"acceptance": {proposer: mean}, "realized": {mode: factor},
    "overhead": {"tier/role": seconds}, "seen": when last remembered}; the MAX_KINDS seen last are kept."""

    # 2: speed factors measured at each stretch's own acceptance; 3: against the model of take-all target
    # checks (speed_model.check_sizes), not of checks of exactly gamma2; 4: past the overhead between
    # forwards, now modelled per tier and role; 5: against the model of chains that `stop_below` ends early
    # (speed_model.stopped_chain_yields), with their STOP_RATES beside the acceptance
    filename = "priors-5.json"

    def __init__(self, path=None):
        super().__init__(path)
        self._seen: dict[str, list[tuple]] = {}  # per entry: what requests saw since its last save

    @staticmethod
    def valid(key: str, value) -> bool:
        """{"acceptance": {proposer: [0, 1]}, "realized": {mode: factor > 0}, "overhead": {name: seconds},
        "seen": time}, all three parts there (one missing failed `remember` after the request's tokens)."""
        if not isinstance(value, dict) or set(value) - {"seen"} != {"acceptance", "realized", "overhead"}:
            return False
        return finite_numbers(value["acceptance"], 0, 1.0000001) and finite_numbers(value["realized"], 1e-12) \
            and finite_numbers(value["overhead"]) and finite_numbers({"seen": value.get("seen", 0.0)})

    @staticmethod
    def pruned(entries: dict[str, dict]) -> dict[str, dict]:
        """The MAX_KINDS entries remembered last."""
        if len(entries) <= MAX_KINDS:
            return entries
        kept = sorted(entries, key=lambda k: (entries[k].get("seen", 0.0), k), reverse=True)[:MAX_KINDS]
        return {key: entries[key] for key in kept}

    def recall(self, key: str) -> dict[str, dict[str, float]]:
        """What earlier requests of kind `key` left; for a kind none ran yet, the speed factors of the kind
        remembered last among its kin (kinds that differ from it only in their sampling settings: `kin`).
        A factor corrects the cost model for what the machine, the tiers and the batch make of it, which the
        sampling hardly moves (on the AMX Xeon at 8 x 8K, `triforce` reached 0.834 of its model greedy and 0.775
        at 0.6), while acceptance and the overhead between forwards depend on it: a request at a new
        temperature, or a server's request with its own JSON schema, had tried again a mode its kin had
        measured short of its model (`triforce` in a batch of 8, for 23 of its 128 tokens)."""
        entry = self.entries.get(key)
        if entry is None:
            kins = [e for k, e in self.entries.items() if kin(k) == kin(key)]
            newest = max(kins, key=lambda e: e.get("seen", 0.0), default={})
            return {"acceptance": {}, "realized": dict(newest.get("realized", {})), "overhead": {}}
        return {part: dict(entry.get(part, {})) for part in ("acceptance", "realized", "overhead")}

    def remember(self, key: str, acceptance: dict[str, float | None], realized: dict[str, float] | None,
                 generic: dict[str, float], overhead: dict[str, float] | None = None) -> None:
        """A request of kind `key` ended: `acceptance` per proposer (None: too little evidence), the
        `realized` factors of the modes it ran (None: it holds none measured as its kind runs, so the
        factors stay as they are), the `overhead` it measured; `generic` the acceptance priors a new kind
        starts from. Merged into the entry as the file holds it when saved (`merged`)."""
        if not any(a is not None for a in acceptance.values()) and not realized:
            return
        seen = (acceptance, realized, generic, overhead or {})
        self._seen.setdefault(key, []).append(seen)
        self.entries[key] = _merged_into(self.entries.get(key), *seen)
        self.entries = self.pruned(self.entries)  # in memory too (TRIFORCE_CALIBRATION=0: a server's only copy)
        self.save(key)
        if key not in self._changed:  # saved: the file holds them now
            self._seen.pop(key, None)

    def merged(self, key: str, theirs: dict, ours: dict) -> dict:
        """What this process's requests saw since its last save, merged into the file's entry: the entry it
        held, an older read, wrote another process's requests out (one that remembered 0.9 lost it to one
        that remembered 0.1 from its stale copy, where the two were to be averaged)."""
        for seen in self._seen.get(key, []):
            theirs = _merged_into(theirs, *seen)
        return theirs if key in self._seen else ours


def _merged_into(entry: dict | None, acceptance: dict[str, float | None], realized: dict[str, float] | None,
                 generic: dict[str, float], overhead: dict[str, float]) -> dict:
    """`entry` (None: none yet) with what one request saw merged in (the module docstring's rules)."""
    entry = {part: dict((entry or {}).get(part, {})) for part in ("acceptance", "realized", "overhead")}
    entry["overhead"].update({k: round(x, 6) for k, x in overhead.items()})
    known = entry["acceptance"]
    for name, mean in acceptance.items():
        old = known.get(name)
        if mean is not None:
            known[name] = round(mean if old is None else (1 - NEW_WEIGHT) * old + NEW_WEIGHT * mean, 4)
        elif old is not None:
            known[name] = round(old + DRIFT * (generic[name] - old), 4)
    if realized is not None:
        for mode, x in entry["realized"].items():
            if mode not in realized:
                entry["realized"][mode] = round(1 + (1 - DRIFT) * (x - 1), 4)
        entry["realized"].update({mode: round(x, 4) for mode, x in realized.items()})
    entry["seen"] = _clock()
    return entry
