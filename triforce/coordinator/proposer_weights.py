"""Which weights a proposing tier reads where the config leaves it open (`retrieval_weights="auto"`,
`draft_weights="auto"`, the defaults): the model's own, or its int8 twin (models/quantized.py).

A proposer's weights never change the output (the target checks every token with its own), only how
fast proposals come and how many are accepted. The twin costs little acceptance (at 0.6 over 4K tokens of
*Emma*, a draft's expected acceptance stays within 0.01 of its own, 0.96-0.98; over a retrieval cache,
teacher-forced, 0.943 against 0.947: docs/speed.md), and its forward reads half the bytes where the CPU
kernels take int8 rows, which pays where reading weights bounds a forward: SmolLM2's and the Qwen pair's
layers (a forward of the twin took 0.55-0.75x the time of the model's own on the 2-core Zen 4) but not the
shipped 4-layer draft of SmolLM2, whose forward is mostly its overheads (0.99x). So the choice is measured,
once per machine and model shape: a forward of each at TIMED_TOKENS tokens on the full-cache path over a
short cache (the attention over a tier's own cache costs both alike), the fastest of REPEATS taking turns,
kept in `$TRIFORCE_HOME/calibration/proposer-weights-1.json` (calibration.py; the machine's key changes, and
a choice is timed again, with the CPU, its kernels' sources, torch's version or the thread count; delete the
file to time again for other reasons, a machine that was busy while it timed, say). The twin runs
where it takes at most MARGIN of the model's time, summed over those sizes (the margin covers what it costs
in acceptance). A twin that could not run well, or would take more than MEMORY_SHARE of the memory free, is
not tried: the model's own weights run, and `why` says which. TRIFORCE_PROPOSER_WEIGHTS=own runs the models'
own weights wherever the config says "auto", timing nothing (runs that must not depend on a timing: the tests).
"""
from __future__ import annotations

import logging
import os
import time

import torch

from ..cache.full import FullKVCache
from ..errors import UserError
from ..models.llama import LlamaModel
from ..models.quantized import int8_twin, twin_refusal
from .calibration import CalibrationFile, finite_numbers
from .costs import machine_key, model_key

log = logging.getLogger(__name__)

TIMED_TOKENS = {"retrieval": (1, 5), "draft": (1,)}  # per role: the tokens of its usual forwards (the retrieval
# tier proposes one token at a time and checks the draft's chain of 4 with the next; the draft steps one)
REPEATS = 5
MARGIN = 0.95
MEMORY_SHARE = 0.1  # of the memory free, the most a twin made by default may take (the rest: KV caches)


class WeightTimes(CalibrationFile):
    """Seconds per forward of models and their twins: entries "machine||model" -> {"own:N" / "int8:N": s}."""

    filename = "proposer-weights-1.json"

    @staticmethod
    def valid(key: str, value) -> bool:
        return "||" in key and finite_numbers(value, 1e-12) and \
            all(k.partition(":")[0] in ("own", "int8") and k.partition(":")[2].isdecimal() for k in value)


def choose_weights(model: LlamaModel, role: str, table: WeightTimes | None = None,
                   twin: LlamaModel | None = None) -> tuple[LlamaModel, dict]:
    """The weights the `role` tier ("retrieval" or "draft") runs by default: `model` or its int8 twin (`twin`
    where one is made already), and why: {"weights": "int8" | "own", "why": words, "ms": {"own:N": ...,
    "int8:N": ...} where timed}."""
    pinned = os.environ.get("TRIFORCE_PROPOSER_WEIGHTS")
    if pinned == "own":
        return model, {"weights": "own", "why": "TRIFORCE_PROPOSER_WEIGHTS=own"}
    if pinned:  # (a typo would time and choose without a word)
        raise UserError(f"TRIFORCE_PROPOSER_WEIGHTS={pinned!r}: the one value it takes is 'own' (the models' own "
                        f"weights wherever the config says auto); unset it to choose by timing")
    refusal = twin_refusal(model, memory_share=MEMORY_SHARE) if twin is None else None
    if refusal is not None:
        return model, {"weights": "own", "why": f"the int8 twin {refusal}"}
    table = table or WeightTimes.default()
    # (a reduced-vocabulary draft's logits spread over its target's vocabulary: a shape of its own)
    key = f"{machine_key(str(model.device))}||{model_key(model)}|{model.output_vocab_size}"
    entry = table.entries.setdefault(key, {})
    sizes = TIMED_TOKENS[role]
    untimed = [n for n in sizes if f"own:{n}" not in entry or f"int8:{n}" not in entry]
    if untimed:
        twin = twin or int8_twin(model, role)  # (a twin measured slower is not made again: the entry stays)
        for n in untimed:
            own, int8 = forward_seconds([model, twin], n)
            entry.update({f"own:{n}": own, f"int8:{n}": int8})
        table.save(key)
    own, int8 = (sum(entry[f"{kind}:{n}"] for n in sizes) for kind in ("own", "int8"))
    ms = {k: round(v * 1e3, 3) for k, v in sorted(entry.items()) if int(k.partition(":")[2]) in sizes}
    chosen = int8 <= MARGIN * own
    why = (f"a forward of the int8 twin took {int8 / own:.2f}x the time of the model's own at "
           f"{'/'.join(map(str, sizes))} token(s) on this machine ({'at most' if chosen else 'more than'} {MARGIN})")
    log.info("%s tier: %s weights (%s)", role, "int8" if chosen else "its own", why)
    if not chosen:
        return model, {"weights": "own", "why": why, "ms": ms}
    return twin or int8_twin(model, role), {"weights": "int8", "why": why, "ms": ms}


def forward_seconds(models: list[LlamaModel], n: int) -> list[float]:
    """Per model, the fastest of REPEATS forwards of n tokens on the full-cache path (an empty cache each
    time, made once per model: its buffers outside the time), the models taking turns, after one untimed
    forward each (a first call's allocations and kernel loads)."""
    best = [float("inf")] * len(models)
    tokens = torch.arange(n, device=models[0].device) % models[0].output_vocab_size
    caches = [FullKVCache(model.config, n, model.dtype, model.device) for model in models]
    with torch.inference_mode():
        for run in range(REPEATS + 1):
            for i, (model, cache) in enumerate(zip(models, caches)):
                cache.reset()
                start = time.perf_counter()
                model(tokens, cache)
                if run:
                    best[i] = min(best[i], time.perf_counter() - start)
    return best
