"""triforce: lossless hierarchical speculative decoding for long-context generation."""
import os

# Decoding runs ~120 short parallel regions per token. For a while during development, with OpenMP's
# default spin (300,000 turns), one more runnable process (a `| cat` reading our stdout) on a 2-core
# machine made decoding 6x slower; later the same run was fine, so the cause is not pinned down. A short
# spin never collapsed and cost nothing measurable. Takes effect only if torch is not yet imported; set
# GOMP_SPINCOUNT or OMP_WAIT_POLICY yourself to override.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "30000")
# TRIFORCE_CPU_ISA=avx2 runs as an AVX2-only CPU would (kernels/cpu.py): torch's own kernels follow
# (ATen's dispatch, oneDNN's ISA), so that a machine with AVX-512 can measure the other machines' path;
# =avx512 keeps oneDNN off AMX tiles as well (torch's bfloat16 products of prefill chunks went to them, so
# an "avx512" run on a Sapphire Rapids was partly an AMX one). Only if torch is not yet imported and those
# variables are not already set.
_ISA = os.environ.get("TRIFORCE_CPU_ISA", "").strip().lower()
if _ISA == "avx2":
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
elif _ISA == "avx512":
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")

# The package's names load on first use (PEP 562): `triforce --help`, and a Ctrl-C while torch loads, are
# the command line's (launch/cli.py) to answer, not an import's traceback
_NAMES = {"LLM": "api", "EngineConfig": "config", "SamplingParams": "sampling_params", "Logprob": "logprobs",
          "CompletionOutput": "request", "RequestOutput": "request", "StructuredOutputs": "sampling_params",
          "StructuredOutputsParams": "sampling_params"}


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'triforce' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))  # (the lazy names too: a REPL's completion lists them)


__all__ = ["LLM", "RequestOutput", "CompletionOutput", "Logprob", "SamplingParams", "StructuredOutputs",
           "StructuredOutputsParams", "EngineConfig"]
__version__ = "0.1.0"
