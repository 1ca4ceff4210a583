"""triforce: lossless hierarchical speculative decoding for long-context generation."""
from .api import LLM, RequestOutput
from .config import EngineConfig, SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams", "EngineConfig"]
__version__ = "0.1.0"
