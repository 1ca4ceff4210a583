"""A change to the CPU attention, linear or element-wise kernels against a base revision, both built and timed
in one process.

    python benchmarks/kernel_ab.py [--base HEAD] [--level avx512] [--kernel attention|linear|elementwise]
                                   [--tokens 8000 300] [--new 1 7] [--tree] [--dtype float32]
                                   [--cflags=-mtune=znver3]

Builds the kernels of one level (`triforce/kernels/csrc/`) twice, from the base revision and from the
working tree, as separate modules (a source the base revision lacks is left out of its build), and times
SmolLM2-shaped decode attention (9 query heads, 3 KV heads, head dim 64, 30 layers, a K/V buffer per
layer so a long cache comes from memory), the bfloat16 linear layers of its 30 layers (--new rows of x;
--tokens unused) or its 30 layers' element-wise steps (two RMSNorms and silu * up of --new rows; --tree: attention of a token tree's mask, a seeded tree whose branches run deep, instead
of a chain; --dtype float32: the float32 kernels, decode_attention_f32 and linear_f32) with the two builds taking turns, the order swapped every repetition. On these shared
machines two runs minutes apart differ by 20-30%, more than most kernel changes: compare builds within one
process, never across runs. --cflags: extra compiler flags for the working tree's build only (with --base
HEAD, the same sources built two ways).
Prints a JSON line per (tokens, new tokens): median and best ms of each build and new / base."""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from triforce.kernels import build as kernel_build
from triforce.kernels import cpu
from triforce.step import ancestor_mask

from check_rows import deep_tree


def build(name: str, folder: Path, level: str, extra_flags: tuple[str, ...] = ()):
    from torch.utils import cpp_extension

    sources, flags = kernel_build.BUILDS[level]
    return cpp_extension.load(name=name, sources=[str(folder / s) for s in sources if (folder / s).exists()],
                              extra_cflags=["-O3", "-fopenmp", *flags, *extra_flags], extra_ldflags=["-fopenmp"],
                              verbose=False)


def base_sources(rev: str, into: Path) -> Path:
    """The csrc folder of revision `rev`, written under `into`."""
    root = Path(subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip())
    relative = kernel_build.CSRC.relative_to(root)
    names = subprocess.check_output(["git", "ls-tree", "--name-only", f"{rev}:{relative}"], text=True, cwd=root)
    for name in names.split():
        (into / name).write_bytes(subprocess.check_output(["git", "show", f"{rev}:{relative}/{name}"], cwd=root))
    return into


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="HEAD", help="the git revision to compare with (default HEAD)")
    p.add_argument("--level", default=None, help="avx2, avx512 or amx (default: this CPU's level)")
    p.add_argument("--tokens", type=int, nargs="+", default=[8000, 300], help="cached keys")
    p.add_argument("--new", type=int, nargs="+", default=[1, 7], help="new tokens (query rows per query head)")
    p.add_argument("--reps", type=int, default=12, help="timed passes of each build")
    p.add_argument("--kernel", choices=("attention", "linear", "elementwise"), default="attention", help="what to time")
    p.add_argument("--tree", action="store_true", help="attention: a token tree of --new nodes, not a chain")
    p.add_argument("--dtype", choices=("bfloat16", "float32", "int8"), default="bfloat16",
                   help="the kernels' element type (int8: linear_i8's int8 weights, bfloat16 x; --kernel linear)")
    p.add_argument("--cflags", default="", help="extra compiler flags, comma-separated, for the working tree's "
                   "build only (e.g. --cflags=-mtune=znver3)")
    args = p.parse_args()
    if args.dtype == "int8" and args.kernel != "linear":
        p.error("--dtype int8 is for --kernel linear (int8 weights)")
    if args.kernel == "elementwise" and args.dtype != "bfloat16":
        p.error("--kernel elementwise is bfloat16 only (the fused kernels')")
    level = args.level or cpu.isa_level()
    with tempfile.TemporaryDirectory() as tmp:
        base = build(f"triforce_ab_base_{level}", base_sources(args.base, Path(tmp)), level)
    extra = tuple(f for f in args.cflags.split(",") if f)
    flavour = "_" + hashlib.sha1(args.cflags.encode()).hexdigest()[:8] if extra else ""  # its own build folder
    new = build(f"triforce_ab_new_{level}{flavour}", kernel_build.CSRC, level, extra)
    layers = 30
    dtype = torch.bfloat16 if args.dtype == "int8" else getattr(torch, args.dtype)
    for s in args.tokens if args.kernel == "attention" else [None]:
        if args.kernel == "attention":
            keys, values = torch.randn(layers, 3, s, 64, dtype=dtype), torch.randn(layers, 3, s, 64, dtype=dtype)
        elif args.kernel == "linear":  # qkv, o, gate_up and down of each layer: 212 MB in all, read from memory on every pass
            shapes = ((960, 576), (576, 576), (3072, 576), (576, 1536))
            if args.dtype == "int8":
                weights = [[(torch.randint(-127, 128, shape, dtype=torch.int8), torch.rand(shape[0]) / 100)
                            for shape in shapes] for _ in range(layers)]
            else:
                weights = [[torch.randn(shape, dtype=dtype) for shape in shapes] for _ in range(layers)]
        for n in args.new:
            if args.kernel == "attention":
                q = torch.randn(9, n, 64, dtype=dtype)
                mask = ancestor_mask(deep_tree(n, n)) if args.tree else None

                def one_pass(ext):
                    for layer in range(layers):
                        if dtype == torch.float32:
                            ext.decode_attention_f32(q, keys[layer], values[layer], 0.125, mask)
                        else:
                            ext.decode_attention_bf16(q, keys[layer], values[layer], 0.125,
                                                      allow_amx=level == "amx", mask=mask)
            elif args.kernel == "elementwise":
                x, norm, gate_up = torch.randn(n, 576, dtype=dtype), torch.randn(576, dtype=dtype), torch.randn(n, 3072, dtype=dtype)

                def one_pass(ext):
                    for _ in range(layers):
                        ext.rms_norm_bf16(x, norm, 1e-5)
                        ext.silu_mul_bf16(gate_up)
                        ext.rms_norm_bf16(x, norm, 1e-5)
            else:
                xs = {k: torch.randn(n, k, dtype=dtype) for k in (576, 1536)}

                def one_pass(ext):
                    for layer in weights:
                        for w in layer:
                            if args.dtype == "int8":
                                ext.linear_i8(xs[w[0].shape[1]], w[0], w[1], False)
                            elif dtype == torch.float32:
                                ext.linear_f32(xs[w.shape[1]], w)
                            else:
                                ext.linear_bf16(xs[w.shape[1]], w, float_out=False, allow_amx=level == "amx")
            times: dict[str, list[float]] = {"base": [], "new": []}
            for rep in range(args.reps + 1):
                builds = [("base", base), ("new", new)]
                for name, ext in builds if rep % 2 else builds[::-1]:
                    start = time.perf_counter()
                    one_pass(ext)
                    if rep:  # the first pass of each warms up
                        times[name].append(time.perf_counter() - start)
            median = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
            print(json.dumps({"level": level, "kernel": args.kernel, "dtype": args.dtype, "tokens": s, "new_tokens": n,
                              **({"tree": deep_tree(n, n)} if args.tree else {}),
                              "threads": torch.get_num_threads(),
                              **{f"{k}_median_ms": round(v, 2) for k, v in median.items()},
                              **{f"{k}_best_ms": round(min(v) * 1e3, 2) for k, v in times.items()},
                              "new_over_base": round(median["new"] / median["base"], 3)}), flush=True)


if __name__ == "__main__":
    main()
