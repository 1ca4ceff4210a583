"""Milliseconds of CPU a run of the suite's chi-square tests takes, case by case, run as the tests run them
(tests/sampling_runs.py: seeded requests, 250 to a batch): the two-token cases of
tests/coordinator/test_engine.py and the first-token cases with real chunk selection of
tests/coordinator/test_selection_sampling.py, their models written as the tests write them. The cases take
turns over `--repeats` rounds and the fastest round of each is printed (process time, one thread: on a shared
2-core machine identical rounds of these tiny runs differed by a fifth). `--shared-prefix` also runs each
first-token case at a prefill chunk of 16, alone and with its prompt's target KV shared among the runs
through a PrefixStore of 16-token blocks, and says whether the outputs were the same.

    python benchmarks/chi_square_runs.py --runs 500 --repeats 3 > chi_square_runs.json
"""
import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500, help="seeded runs per case and round (default 500)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the fastest of each case is kept")
    parser.add_argument("--two-token", type=int, nargs="*", default=[0, 1, 4, 11, 13],
                        help="indices into test_engine.SAMPLING_CASES (default: 0 1 4 11 13)")
    parser.add_argument("--first-token", type=int, nargs="*", default=[0, 1],
                        help="indices into test_selection_sampling.CASES (default: 0 1)")
    parser.add_argument("--shared-prefix", action="store_true", help="also the first-token cases with a PrefixStore")
    args = parser.parse_args()
    if args.runs < 1 or args.repeats < 1:
        parser.error("--runs and --repeats must be at least 1")

    import torch

    torch.set_num_threads(1)
    sys.path[:0] = [str(TESTS), str(TESTS / "coordinator")]
    from checkpoints import write_tiny_checkpoint
    from sampling_runs import outputs
    import test_engine
    import test_selection_sampling as selection
    from triforce.cache.prefixes import PrefixStore
    from triforce.config import EngineConfig
    from triforce.coordinator.hierarchy import build_engine
    from triforce.models.loader import load_model
    from triforce.sampling_params import SamplingParams

    for name, cases in (("--two-token", test_engine.SAMPLING_CASES), ("--first-token", selection.CASES)):
        chosen = getattr(args, name[2:].replace("-", "_"))
        if any(not 0 <= i < len(cases) for i in chosen):
            parser.error(f"{name} takes indices 0-{len(cases) - 1}")
    folder = Path(tempfile.mkdtemp(prefix="chi_square_runs_"))
    small = dict(vocab_size=8, hidden_size=32, num_heads=4, num_kv_heads=2, scale=4)
    draft8, _, target8 = [load_model(write_tiny_checkpoint(folder / f"v8-{i}", seed=20 + i, num_layers=layers, **small))
                          for i, layers in enumerate((1, 2, 2))]
    spec = dict(vocab_size=selection.VOCAB, hidden_size=64, num_heads=4, num_kv_heads=2, scale=4)
    target = selection.sharpen_attention(
        load_model(write_tiny_checkpoint(folder / "select-target", seed=40, num_layers=3, **spec)), 3.0)
    draft = load_model(write_tiny_checkpoint(folder / "select-draft", seed=41, num_layers=1, **spec))
    prompt8 = [int(t) for t in torch.randint(0, 8, (40,), generator=torch.Generator().manual_seed(4))]
    prompt = torch.randint(0, selection.VOCAB, (selection.PROMPT_LEN,),
                           generator=torch.Generator().manual_seed(4)).tolist()

    def two_token(index):
        mode, policy, sampling, trees = test_engine.SAMPLING_CASES[index]
        if "structured_outputs" in sampling:
            return None  # (a grammar's guide needs the tests' tokenizer fixture)
        cfg = EngineConfig(mode=mode, retrieval_policy=policy, **{"gamma1": 2, "gamma2": 3, **trees},
                           **test_engine.SELECTING)
        return lambda seed: build_engine(cfg, target8, draft8, len(prompt8) + 2).run(
            prompt8, SamplingParams(max_tokens=2, ignore_eos=True, seed=seed, **sampling))

    def first_token(index, chunk=None, shared=False):
        mode, policy, sampling, _, trees = selection.CASES[index]
        cfg = EngineConfig(mode=mode, retrieval_policy=policy, **{**selection.SETTINGS, **trees})
        if chunk is not None:
            cfg = dataclasses.replace(cfg, prefill_chunk=chunk)
        store = PrefixStore(2 ** 30, chunk) if shared else None
        return lambda seed: build_engine(cfg, target, draft, len(prompt) + 1, prefixes=store).run(
            prompt, SamplingParams(max_tokens=1, ignore_eos=True, seed=seed, **sampling))

    cases = {f"two-token {i}: {test_engine.SAMPLING_CASES[i]}": two_token(i) for i in args.two_token}
    for i in args.first_token:
        label = f"first-token {i}: {selection.CASES[i]}"
        cases[label] = first_token(i)
        if args.shared_prefix:
            cases[label + " chunk 16"] = first_token(i, 16)
            cases[label + " chunk 16 shared prefix"] = first_token(i, 16, shared=True)
    cases = {label: make for label, make in cases.items() if make is not None}
    best, results = {}, {}
    for _ in range(args.repeats):
        for label, make in cases.items():
            start = time.process_time()
            results[label] = outputs(make, range(args.runs))
            best[label] = min(best.get(label, float("inf")), (time.process_time() - start) / args.runs * 1e3)
    same = {label: results[label] == results[label[: -len(" shared prefix")]]
            for label in results if label.endswith(" shared prefix")}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=TESTS.parent).stdout.strip()
    print(json.dumps({"commit": commit, "runs": args.runs, "repeats": args.repeats, "cpu": _cpu(),
                      "torch": torch.__version__,
                      "ms_per_run": {k: round(v, 2) for k, v in best.items()},
                      "shared_prefix_same_outputs": same}, indent=1))


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return os.uname().machine


if __name__ == "__main__":
    main()
