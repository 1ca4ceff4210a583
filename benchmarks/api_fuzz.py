"""Random configurations through `LLM.generate`, checked for exactness where users reach the hierarchy: what
benchmarks/exactness_fuzz.py checks on the engine, with text prompts, a tokenizer, stop strings, n > 1,
log-probabilities, bad words, structured outputs, int8 twins made by LLM and its prefix cache.

    python benchmarks/api_fuzz.py [--cases 200] [--seed 0] [--only K] [--out FILE.jsonl]

Each case draws, from its own seed, the engine settings of exactness_fuzz (mode, tiers, trees, gammas,
policy, budget, lookup, proposer weights), a dtype, a pair of tiny kernel-sized models whose tokens are
single characters (tests/checkpoints.py: write_char_tokenizer), a prefix cache or none, and one to four
text prompts with SamplingParams of exactness_fuzz's draws plus stop strings (kept in the text or not),
bad words, log-probabilities of the chosen and the top tokens, n of 2 or 3 for sampled requests, and now
and then a constraint (a regular expression or a choice). Then:
- every greedy request equals `LLM(mode="ar")`'s answer alone: its token ids, text, finish and stop reasons
  and log-probabilities;
- every request's outputs are the same when its prompts run together as when each runs alone (seeded
  samples too, where they repeat: exactness_fuzz.samples_repeat).
Prints a JSON line per case and a summary; exits 1 if any case failed."""
from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

import torch

import exactness_fuzz as fuzz
from checkpoints import CHARS, write_char_tokenizer
from triforce import LLM, SamplingParams
from triforce.sampling_params import StructuredOutputs

TEXT = CHARS[:fuzz.VOCAB - 3]  # the characters the tokenizer has
PATTERNS = ["[a-f]{2,5}", "(yes|no)[0-9]", "[0-9]+( [a-z]+)?"]


def text_params(rng: random.Random, index: int, arch: str) -> dict:
    """exactness_fuzz's settings of one request, and the text-level ones (constraints with a Llama pair only:
    transformers reads the char tokenizer beside a Qwen2 config with one token more than the model has, which
    llguidance refuses, rightly)."""
    p = fuzz.request_params(rng, index)
    p.pop("allowed_token_ids", None)  # (it would leave a constraint no tokens to finish with)
    if rng.random() < 0.3:
        p["stop"] = [rng.choice(TEXT) + rng.choice(["", rng.choice(TEXT)]) for _ in range(rng.randint(1, 2))]
        p["include_stop_str_in_output"] = rng.random() < 0.5
    if rng.random() < 0.15:
        p["bad_words"] = [rng.choice(TEXT).strip() or "a" for _ in range(2)]
    if rng.random() < 0.3:
        p["logprobs"] = rng.choice([0, 2])
    if p["temperature"] and rng.random() < 0.25:
        p["n"] = rng.choice([2, 3])
    if rng.random() < 0.1 and arch == "llama2":
        p["structured_outputs"] = rng.choice([{"regex": rng.choice(PATTERNS)}, {"choice": ["red", "green", "blue"]}])
        p.pop("min_tokens", None), p.pop("bad_words_ids", None), p.pop("logit_bias", None)
    return p


def draw_case(seed: int, index: int) -> dict:
    rng = random.Random(f"api:{seed}:{index}")
    settings = fuzz.engine_settings(rng)
    prompts = ["".join(rng.choice(TEXT) for _ in range(rng.randint(5, 200))) for _ in range(rng.choice([1, 2, 3, 4]))]
    arch = rng.choice(fuzz.ARCHS)
    return dict(arch=arch, kind=rng.choice(list(fuzz.SHARES)), dtype=rng.choice(["float32", "float32", "bfloat16"]),
                settings=settings, prefix_cache_gb=rng.choice([0, 0.01]), prompts=prompts,
                params=[text_params(rng, i, arch) for i in range(len(prompts))])


def write_text_pairs(folder: Path) -> dict:
    """exactness_fuzz.write_pairs, each model with a tokenizer of single characters."""
    folders = fuzz.write_pairs(folder)
    for pair in folders.values():
        for model in pair:
            write_char_tokenizer(model, fuzz.VOCAB)
    return folders


def sampling(p: dict) -> SamplingParams:
    p = dict(p)
    if "structured_outputs" in p:
        p["structured_outputs"] = StructuredOutputs(**p["structured_outputs"])
    for name in ("stop", "bad_words"):
        if name in p:
            p[name] = tuple(p[name])
    return fuzz.sampling(p)


def seen_outputs(request) -> list:
    """What a request's outputs say, for comparison: per output its ids, text, reasons and log-probabilities."""
    return [(o.token_ids, o.text, o.finish_reason, o.stop_reason, o.cumulative_logprob,
             None if o.logprobs is None else [sorted((t, l.logprob) for t, l in lp.items()) for lp in o.logprobs])
            for o in request.outputs]


def check_case(case: dict, folders: dict) -> list[str]:
    target, draft = folders[case["arch"], case["kind"]]
    settings = dict(case["settings"])
    mode = settings.pop("mode")
    llm = LLM(target, draft if mode != "retrieval" else None, mode=mode, dtype=case["dtype"],
              prefix_cache_gb=case["prefix_cache_gb"], **settings)
    params = [sampling(p) for p in case["params"]]
    alone = [seen_outputs(llm.generate(prompt, sp)[0]) for prompt, sp in zip(case["prompts"], params)]
    failures = []
    greedy = [i for i, sp in enumerate(params) if sp.temperature == 0]
    if greedy:
        ar = LLM(target, None, mode="ar", dtype=case["dtype"], prefix_cache_gb=0,
                 prefill_chunk=settings["prefill_chunk"])  # (in bfloat16 a prompt's chunks decide its rounding)
        for i in greedy:
            want = seen_outputs(ar.generate(case["prompts"][i], params[i])[0])
            if alone[i] != want:
                failures.append(f"request {i} (greedy) parts from ar: {differs(alone[i], want)}")
    if len(params) > 1:
        together = [seen_outputs(r) for r in llm.generate(case["prompts"], params)]
        for i, sp in enumerate(params):
            if (sp.temperature == 0 or fuzz.samples_repeat(llm.config)) and together[i] != alone[i]:
                failures.append(f"request {i} in the batch parts from alone: {differs(together[i], alone[i])}")
    return failures


def differs(a: list, b: list) -> str:
    """Where two requests' outputs first differ, in words."""
    names = ("token_ids", "text", "finish_reason", "stop_reason", "cumulative_logprob", "logprobs")
    for k, (x, y) in enumerate(zip(a, b)):
        for name, u, v in zip(names, x, y):
            if u != v:
                return f"output {k} {name}: {str(u)[:120]} / {str(v)[:120]}"
    return f"{len(a)} / {len(b)} outputs"


def main() -> None:
    args = fuzz.case_arguments(__doc__).parse_args()
    torch.set_grad_enabled(False)
    indices = [args.only] if args.only is not None else range(args.cases)
    failed, start = 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folders = write_text_pairs(Path(tmp))
        for index in indices:
            case = draw_case(args.seed, index)
            with fuzz.case_environment(Path(tmp) / f"calibration{index}"):
                failures = fuzz.findings(lambda: check_case(case, folders))
            failed += bool(failures)
            fuzz.record(dict(case=index, seed=args.seed, ok=not failures, failures=failures, **case), args.out)
    fuzz.finish(len(indices), failed, start)


if __name__ == "__main__":
    main()
