"""triforce: lossless hierarchical speculative decoding for long-context generation."""
import os

# Decoding runs ~120 short parallel regions per token. With OpenMP's default busy-waiting, one more
# runnable process (even a `| cat` reading our stdout) on a 2-core machine made decoding 6x slower;
# passive waiting costs ~12% at best and never collapses. Takes effect only if torch is not yet imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .api import LLM, RequestOutput  # noqa: E402
from .config import EngineConfig, SamplingParams  # noqa: E402

__all__ = ["LLM", "RequestOutput", "SamplingParams", "EngineConfig"]
__version__ = "0.1.0"
