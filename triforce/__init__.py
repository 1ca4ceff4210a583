"""triforce: lossless hierarchical speculative decoding for long-context generation."""
import os

# Decoding runs ~120 short parallel regions per token. With OpenMP's default spinning (300,000 turns),
# one more runnable process (even a `| cat` reading our stdout) on a 2-core machine made decoding 6x
# slower; passive waiting cost ~12%. A short spin keeps most of the speed and never collapsed. Takes
# effect only if torch is not yet imported; set GOMP_SPINCOUNT or OMP_WAIT_POLICY yourself to override.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "30000")

from .api import LLM, RequestOutput  # noqa: E402
from .config import EngineConfig, SamplingParams  # noqa: E402

__all__ = ["LLM", "RequestOutput", "SamplingParams", "EngineConfig"]
__version__ = "0.1.0"
