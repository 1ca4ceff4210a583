"""Random configurations through the whole hierarchy, checked for exactness: what the fixed tests check
case by case (tests/coordinator/test_batch.py, test_engine.py), over combinations no test names.

    python benchmarks/exactness_fuzz.py [--cases 200] [--seed 0] [--only K] [--out FILE.jsonl]
                                        [--workers N [--pair llama2:close]] [--vocab 96]

Each case draws, from its own seed (--seed and its index, so `--only K` repeats case K alone): a mode
(draft, retrieval, triforce or auto: mostly on a script of plans that switch tiers, gammas and budgets
every 1, 2 or 8 rounds, tests/scripted_planner.py, since on tiny models it would plan `ar`), the
retrieval policy, budget, chunk size, full layers and refresh, gammas, rounds2, a tree at the bottom tier
(size and shape), the prompt lookup, the draft's window, a fixed stop_below, int8 twins for the proposing
tiers, the target as its own draft (`--draft self`: one model object at two tiers, one int8 twin for both
proposers) or, in mode auto, as a second draft beside the draft model (auto_self_draft); and one to four
requests of different prompt lengths, each greedy or sampled (seeded), with top-k / top-p / min-p,
penalties, logit bias, min_tokens, stop token ids, bad words, allowed token ids and
end-of-sequence kept or ignored, one of them maybe joining the running batch late; in three cases in ten
the prompts begin with one document, whose blocks a prefix store keeps (the requests alone restore from
the earlier ones, the batch's from each other). Tiny random models of the CPU kernels' shapes (a 3-layer
target and its first layer as the draft; Llama or Qwen2 with its biases; tiers that agree often or
seldom: write_pairs), in float32 or, one case in three, bfloat16 (where the CPU kernels make a check round
as steps do: docs/status.md); with --workers, every target check (of `ar` too) on a worker group over
gloo, in float32, one pair for every case. `--vocab` widens the models' vocabulary (96 by default): at a
real one's size (49152) torch splits a lone row's sums between two threads and sums a row of [n, V]
whole, which a batch's rows and a lone request's could round apart by (--vocab draws other cases). Then:
- every greedy request, alone and in the batch, equals plain decoding (`ar`) alone, token for token;
- every request gives the same tokens in the batch as alone (sampled ones from their seeds, but where what
  runs follows costs measured as it goes, mode auto and trees sized or shaped by them, the greedy ones only:
  samples_repeat).
Prints a JSON line per case ({"case", "ok", "failures", "accepted_of_proposed" per checking tier over the
requests alone, "config", "requests"}; a raised error is a failure too) and a summary; exits 1 if any case
failed. tests/test_fuzz.py runs a few cases; benchmarks/api_fuzz.py does the like through LLM.generate."""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from itertools import product
from pathlib import Path

import torch

import triforce.coordinator.auto as auto
from triforce.cache.prefixes import PrefixStore
from triforce.config import IGNORED_BY, ConfigError, EngineConfig
from triforce.coordinator.batch import SequenceBatch
from triforce.coordinator.hierarchy import build_engine, graph_sizes, speculation_slack
from triforce.coordinator.remote import RemoteVerifier
from triforce.coordinator.speed_model import tier_kind
from triforce.models.loader import load_model
from triforce.models.quantized import int8_twin, twin_refusal
from triforce.sampling_params import SamplingParams

VOCAB, EOS = 96, 2
ARCHS = ("llama2", "qwen2")
STACKS = [("target",), ("draft", "target"), ("retrieval", "target"), ("draft", "retrieval", "target")]
# the CPU kernels' shapes (head dim 64, K a multiple of 32: tests/kernels/test_check_rows.py), so that checks
# run the paths that round as steps do; smaller heads take torch's paths, which need not (docs/status.md)
KERNEL_SIZED = dict(hidden_size=256, num_heads=4, num_kv_heads=2)
SCALE = 12.0  # the initializer's range x this: peaked distributions
DRAFT_LAYERS = 1
# per kind of pair, what scales the output projections of attention (every layer) and of the MLPs past the
# draft's layers (write_pairs): "close" tiers agreed on 40-85% of proposals, "far" ones on 0-20%
SHARES = {"close": (0.003, 0.15), "far": (1.0, 1.0)}
PREFIX_BYTES = 1 << 26  # a case's prefix store (cache/prefixes.py)


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' helpers
from checkpoints import write_tiny_checkpoint  # noqa: E402
from scripted_planner import follow_script  # noqa: E402


def write_pairs(folder: Path) -> dict:
    """Per (architecture, kind), the folders of a target and its draft, the draft being the target's first
    layer, embeddings and head (tests/checkpoints.py writes the target). Kind "close": attention and the
    layers past the draft's add little to the residual stream, so the tiers agree about half the time or
    more; "far": as written, attention decides, so a partial cache or the draft's window often disagrees."""
    from transformers import AutoModelForCausalLM

    pairs = {}
    for arch, kind in product(ARCHS, SHARES):
        attention, layers = SHARES[kind]
        target = write_tiny_checkpoint(folder / f"{arch}-{kind}-target", arch, seed=11, num_layers=3, scale=SCALE,
                                       vocab_size=VOCAB, **KERNEL_SIZED)
        model = AutoModelForCausalLM.from_pretrained(target)
        for i, layer in enumerate(model.model.layers):
            layer.self_attn.o_proj.weight.data *= attention
            if i >= DRAFT_LAYERS:
                layer.mlp.down_proj.weight.data *= layers
        model.save_pretrained(target)
        model.model.layers = model.model.layers[:DRAFT_LAYERS]
        model.config.num_hidden_layers = DRAFT_LAYERS
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:DRAFT_LAYERS]
        model.save_pretrained(folder / f"{arch}-{kind}-draft")
        pairs[arch, kind] = [target, folder / f"{arch}-{kind}-draft"]
    return pairs


class Models:
    """The models a case runs, loaded once per (architecture, kind, dtype), with their int8 twins where made."""

    def __init__(self, folders: dict):
        self.folders, self.loaded, self.twins = folders, {}, {}

    def pair(self, arch: str, kind: str, dtype: str):
        if (arch, kind, dtype) not in self.loaded:
            self.loaded[arch, kind, dtype] = tuple(load_model(f, dtype) for f in self.folders[arch, kind])
        return self.loaded[arch, kind, dtype]

    def twin(self, model, role: str):
        """model's int8 twin, or None where it is refused (no CPU kernels, say)."""
        if id(model) not in self.twins:
            self.twins[id(model)] = None if twin_refusal(model) else int8_twin(model, role)
        return self.twins[id(model)]


def engine_settings(rng: random.Random) -> dict:
    """A configuration EngineConfig accepts (drawn again where it refuses one)."""
    while True:
        mode = rng.choice(["draft", "retrieval", "triforce", "triforce", "auto"])
        chunk = rng.choice([2, 4, 8])
        s = dict(mode=mode, chunk_size=chunk, budget=chunk * rng.randint(2, 12),
                 retrieval_policy=rng.choice(["static", "dynamic"]), full_layers=rng.choice([0, 0, 1]),
                 refresh_every=rng.choice([8, 12, 32, 512]), sinks=rng.choice([0, 2, 4]),
                 window=rng.choice([8, 16, 32]), prefill_chunk=rng.choice([16, 64, 512]),
                 lookup=rng.choice([0, 2, 3]), gamma1=rng.randint(1, 6), gamma2=rng.randint(1, 8),
                 retrieval_weights=rng.choice(["target", "target", "int8"]),
                 draft_weights=rng.choice(["draft", "draft", "int8"]))
        if mode == "triforce":
            s["rounds2"] = rng.choice([0, 0, 2, 3])
        if mode != "auto":
            tree = rng.choice([0, 0, 3, 6, 10, "auto"])
            s["tree2" if mode == "retrieval" else "tree1"] = tree
            if tree:
                s["tree_shape"] = rng.choice(["sequoia", "confidence"])
            if mode != "retrieval" and not tree:
                s["stop_below"] = rng.choice([0.0, 0.0, 0.3])
        for name in IGNORED_BY.get(mode, ()):  # (LLM refuses a tier's setting in a mode without it)
            s.pop(name, None)
        try:
            EngineConfig(**s)
        except ConfigError:
            continue
        return s


def request_params(rng: random.Random, index: int) -> dict:
    """SamplingParams' settings for one request (JSON-friendly: tuples as lists)."""
    p = dict(max_tokens=rng.randint(4, 48), ignore_eos=rng.random() < 0.7)
    if rng.random() < 0.5:
        p.update(temperature=0.0)
    else:
        p.update(temperature=rng.choice([0.6, 1.0, 1.3]), seed=1000 + index)
        if rng.random() < 0.3:
            p["top_k"] = rng.choice([1, 5, 20])
        if rng.random() < 0.3:
            p["top_p"] = rng.choice([0.5, 0.9])
        if rng.random() < 0.2:
            p["min_p"] = 0.1
    if rng.random() < 0.25:
        p.update(presence_penalty=rng.choice([0.5, 1.5]), frequency_penalty=rng.choice([0.0, 0.7]))
    if rng.random() < 0.2:
        p["repetition_penalty"] = rng.choice([1.2, 2.0])
    if rng.random() < 0.2:
        p["logit_bias"] = [[token, rng.choice([-100.0, 5.0, 30.0])] for token in rng.sample(range(3, VOCAB), 2)]
    if rng.random() < 0.2:
        p["min_tokens"] = rng.randint(1, p["max_tokens"])
    if rng.random() < 0.2:
        p["stop_token_ids"] = [rng.randrange(3, VOCAB)]
    if rng.random() < 0.15:
        p["bad_words_ids"] = [[rng.randrange(3, VOCAB)], [rng.randrange(3, VOCAB), rng.randrange(3, VOCAB)]]
    if rng.random() < 0.1:
        p["allowed_token_ids"] = sorted(rng.sample(range(3, VOCAB), 30)) + [EOS]
    return p


def sampling(p: dict) -> SamplingParams:
    fixed = {k: tuple(map(tuple, v)) if k in ("logit_bias", "bad_words_ids") else tuple(v) if isinstance(v, list)
             else v for k, v in p.items()}
    return SamplingParams(**fixed)


def draw_case(seed: int, index: int) -> dict:
    rng = random.Random(f"{seed}:{index}")
    count = rng.choice([1, 2, 2, 3, 4])
    requests = []
    for i in range(count):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(8, 220))]
        requests.append(dict(prompt=prompt, params=request_params(rng, i)))
    join_after = rng.choice([None, None, 3, 10]) if count > 1 else None
    script = [(rng.choice(STACKS), (rng.randint(1, 6), rng.randint(1, 8)), rng.random())
              for _ in range(rng.randint(1, 4))] if rng.random() < 0.8 else None
    more = random.Random(f"{seed}:{index}:shared")  # (drawn apart: the cases drawn before it stay as they were)
    shared = more.random() < 0.3  # the prompts begin with one document, restored from a prefix store
    if shared:
        document = [more.randrange(3, VOCAB) for _ in range(more.randint(16, 160))]
        for r in requests:
            r["prompt"] = document + r["prompt"][:more.randint(1, 40)]
    settings = engine_settings(rng)
    self_draft = draw_self_draft(random.Random(f"{seed}:{index}:self"), settings)  # (apart too, as above)
    return dict(arch=rng.choice(ARCHS), kind=rng.choice(list(SHARES)),
                dtype=rng.choice(["float32", "float32", "bfloat16"]), settings=settings,
                requests=requests, join_after=join_after, auto_script=script, shared=shared,
                replan_rounds=rng.choice([1, 2, 8]), self_draft=self_draft)


def draw_self_draft(apart: random.Random, settings: dict) -> bool:
    """Whether a case's draft is the target itself (`--draft self`, one case in five); in mode auto
    otherwise, whether the target is a second draft beside it (auto_self_draft, set in `settings`, one case
    in two). From `apart`, a generator of the case's own: the cases drawn before these existed stay as
    they were."""
    self_draft = apart.random() < 0.2
    if settings["mode"] == "auto" and not self_draft:
        settings["auto_self_draft"] = apart.random() < 0.5
    return self_draft


GROUP = None  # with --workers: the worker group (tests/workers/worker_group.py) every target check runs on
OPEN: list = []  # the remote verifiers of the requests running (closed after: the group frees their caches)


def engine(cfg: EngineConfig, tiers, prompt, params, script=None, prefixes: PrefixStore | None = None):
    """The engine of one request; in mode auto on `script` where given (the case's auto_script); its target
    restores and stores prompt blocks in `prefixes` where given, or verifies on GROUP."""
    target, draft, retrieval = tiers
    length, verifier = len(prompt) + params.max_tokens, None
    if GROUP is not None:
        verifier = RemoteVerifier(GROUP.channel, target, length + speculation_slack(cfg),
                                  graph_sizes(cfg, GROUP.channel.prefill_chunk))
        OPEN.append(verifier)
    made = build_engine(cfg, target, draft, length, verifier, retrieval_model=retrieval, prefixes=prefixes)
    return made if script is None or cfg.mode != "auto" else follow_script(made, cfg.budget, scripted(made, script))


def scripted(made, script) -> list:
    """The case's auto_script as the engine's plans: stacks of its tiers (a retrieval tier of one of its
    budgets, and one of its drafts where it holds two, picked by the entry's last number) and gammas cut to
    the stack's proposers."""
    held = {kind: [t.name for t in made.ladder if tier_kind(t.name) == kind] for kind in ("draft", "retrieval")}
    plans = []
    for stack, gammas, pick in script:
        stack = tuple(held[name][int(pick * len(held[name]))] if held.get(name) else name for name in stack)
        plans.append((stack, gammas[:len(stack) - 1]))
    return plans


def run_alone(cfg: EngineConfig, tiers, prompt, params, seen: dict | None = None, script=None,
              prefixes: PrefixStore | None = None) -> list[int]:
    """The request's tokens alone; `seen` sums, per checking tier, its checks' accepted and proposed tokens
    (so a case shows that its tiers disagreed: a check that accepts everything tests little)."""
    try:
        tokens, metrics = engine(cfg, tiers, prompt, params, script, prefixes).generate(prompt, params, (EOS,))
    finally:
        close_verifiers()
    for t in metrics.tiers if seen is not None else ():
        seen[t.name] = [a + b for a, b in zip(seen.get(t.name, [0, 0]), (t.accepted, t.proposed))]
    return tokens


def run_together(cfg: EngineConfig, tiers, prompts, params, join_after, script=None,
                 prefixes: PrefixStore | None = None) -> list[list[int]]:
    try:
        return batched([engine(cfg, tiers, p, sp, script, prefixes).run(p, sp, (EOS,))
                        for p, sp in zip(prompts, params)], join_after)
    finally:
        close_verifiers()


def batched(runs: list, join_after: int | None) -> list[list[int]]:
    """The runs' tokens, run as one batch (the last joining it after `join_after` steps where given)."""
    batch, late = SequenceBatch(), runs.pop() if join_after is not None else None
    handles = [batch.add(r) for r in runs]
    if late is not None:
        for _ in range(join_after):
            batch.step()
        handles.append(batch.add(late))
    batch.run()
    return [h.result[0] for h in handles]


def close_verifiers() -> None:
    while OPEN:
        OPEN.pop().close()


def tiers_for(case: dict, models: Models):
    """(target, draft, retrieval tier's model) for the case; None where an int8 twin it asks for is refused. A
    self draft is the target's model object (its int8 twin the retrieval tier's too, as LLM shares it)."""
    target, draft = models.pair(case["arch"], case["kind"], case["dtype"])
    settings, retrieval = case["settings"], target
    if case.get("self_draft"):
        draft = target
    if settings.get("retrieval_weights") == "int8":
        retrieval = models.twin(target, "retrieval")
    if settings.get("draft_weights") == "int8":
        draft = models.twin(draft, "draft")
    return None if retrieval is None or draft is None else (target, draft, retrieval)


@contextmanager
def case_environment(calibration: Path, replan_rounds: int | None = None):
    """Runs a case with a calibration folder of its own (it plans from nothing measured) and, for an auto
    script (`replan_rounds` given), replanning every that many rounds."""
    saved = os.environ.get("TRIFORCE_CALIBRATION"), auto.REPLAN_ROUNDS, auto.MIN_PLANNED_TOKENS
    os.environ["TRIFORCE_CALIBRATION"] = str(calibration)
    if replan_rounds is not None:
        auto.REPLAN_ROUNDS, auto.MIN_PLANNED_TOKENS = replan_rounds, 1
    try:
        yield
    finally:
        auto.REPLAN_ROUNDS, auto.MIN_PLANNED_TOKENS = saved[1:]
        if saved[0] is None:
            os.environ.pop("TRIFORCE_CALIBRATION")
        else:
            os.environ["TRIFORCE_CALIBRATION"] = saved[0]


def replanning(case: dict) -> int | None:
    """The case's replan_rounds where it runs an auto script (case_environment's argument)."""
    return case["replan_rounds"] if case["auto_script"] else None


def check_case(case: dict, tiers, seen: dict | None = None) -> list[str]:
    """The case's failures, in words (none: it passed); `seen` as run_alone's."""
    cfg = EngineConfig(**case["settings"])
    prompts = [r["prompt"] for r in case["requests"]]
    params = [sampling(r["params"]) for r in case["requests"]]
    failures = []
    script = case["auto_script"]
    store = (lambda: PrefixStore(PREFIX_BYTES, cfg.prefill_chunk)) if case["shared"] else (lambda: None)
    alone_store = store()  # (shared by the requests run alone one after another: the later ones restore)
    alone = [run_alone(cfg, tiers, p, sp, seen, script, alone_store) for p, sp in zip(prompts, params)]
    plain = [run_alone(EngineConfig(mode="ar", prefill_chunk=cfg.prefill_chunk), (tiers[0], None, tiers[0]), p, sp)
             if sp.temperature == 0 else None for p, sp in zip(prompts, params)]
    for i, want in enumerate(plain):
        if want is not None and alone[i] != want:
            failures.append(f"request {i} (greedy) alone parts from ar at token {parted(alone[i], want)}")
    if len(prompts) > 1:
        together = run_together(cfg, tiers, prompts, params, case["join_after"], script, store())
        for i, sp in enumerate(params):
            if plain[i] is not None and together[i] != plain[i]:
                failures.append(f"request {i} (greedy) in the batch parts from ar at token "
                                f"{parted(together[i], plain[i])}")
            elif plain[i] is None and samples_repeat(cfg) and together[i] != alone[i]:
                failures.append(f"request {i} (sampled) in the batch parts from alone at token "
                                f"{parted(together[i], alone[i])}")
    return failures


def samples_repeat(cfg: EngineConfig) -> bool:
    """Whether a seeded sample is the same alone and in a batch: not where what runs follows forward costs
    measured as the request goes (mode auto's plans; trees sized `auto` or shaped by confidence), which a
    batch changes: its distribution is the target's either way (docs/api.md)."""
    tree = cfg.proposal_tree
    return cfg.mode != "auto" and tree != "auto" and not (tree and cfg.tree_shape == "confidence")


def parted(a: list[int], b: list[int]) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"{at} (lengths {len(a)} / {len(b)})"


def case_arguments(doc: str) -> argparse.ArgumentParser:
    """The arguments of both fuzzers (this and api_fuzz.py)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", type=int, help="run case K alone (its index under --seed)")
    p.add_argument("--out", type=Path, help="also append each case's JSON line to this file")
    return p


def findings(check) -> list[str]:
    """check()'s failures, in words, or the error it raised (a finding too)."""
    try:
        return check()
    except Exception as exc:
        return [f"raised {type(exc).__name__}: {exc}", traceback.format_exc(limit=-3)]


def record(line: dict, out: Path | None) -> None:
    """Prints a case's JSON line, and appends it to `out` where given."""
    text = json.dumps(line)
    print(text, flush=True)
    if out:
        with out.open("a") as f:
            f.write(text + "\n")


def finish(count: int, failed: int, start: float) -> None:
    """Prints the summary line and exits, 1 if any case failed."""
    print(json.dumps(dict(cases=count, failed=failed, seconds=round(time.perf_counter() - start, 1))))
    sys.exit(1 if failed else 0)


def main() -> None:
    global GROUP, VOCAB
    p = case_arguments(__doc__)
    p.add_argument("--workers", type=int, default=0,
                   help="verify every target check on a gloo worker group of this many processes (float32, one "
                        "pair for every case: --pair)")
    p.add_argument("--pair", default="llama2:close", help="ARCH:KIND of the pair the worker group serves")
    p.add_argument("--vocab", type=int, default=VOCAB, help="the models' vocabulary size (a real one: 49152)")
    args = p.parse_args()
    VOCAB = args.vocab
    torch.set_grad_enabled(False)
    indices = [args.only] if args.only is not None else range(args.cases)
    failed, start = 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        models = Models(write_pairs(Path(tmp)))
        pair = tuple(args.pair.split(":"))
        if args.workers:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "workers"))
            from worker_group import Group

            GROUP = Group(models.folders[pair][0], args.workers, Path(tmp))
        try:
            for index in indices:
                case = draw_case(args.seed, index)
                if args.workers:  # the group's model, in the dtype it runs, and the static policy (the dynamic
                    case.update(arch=pair[0], kind=pair[1], dtype="float32")  # one needs the full cache here)
                    if "retrieval_policy" in case["settings"]:
                        case["settings"]["retrieval_policy"] = "static"
                tiers = tiers_for(case, models)
                if tiers is None:
                    record(dict(case=index, seed=args.seed, skipped="an int8 twin is refused here"), args.out)
                    continue
                seen = {}
                with case_environment(Path(tmp) / f"calibration{index}", replanning(case)):
                    failures = findings(lambda: check_case(case, tiers, seen))
                failed += bool(failures)
                record(dict(case=index, seed=args.seed, vocab=VOCAB, ok=not failures, failures=failures, accepted_of_proposed=seen,
                            auto_script=case["auto_script"] and case["settings"]["mode"] == "auto",
                            shared_prefix=case["shared"], self_draft=case["self_draft"], arch=case["arch"],
                            kind=case["kind"], dtype=case["dtype"],
                            config=case["settings"], join_after=case["join_after"],
                            requests=[dict(prompt_tokens=len(r["prompt"]), **r["params"]) for r in case["requests"]]),
                       args.out)
        finally:
            if GROUP is not None:
                GROUP.close()
    finish(len(indices), failed, start)

if __name__ == "__main__":
    main()
