"""Engine settings shared by tests across modes, cut to those a mode runs: LLM refuses a tier's setting in a
mode without that tier (EngineConfig.refuse_unused)."""
from triforce.config import IGNORED_BY


def for_mode(mode: str, settings: dict) -> dict:
    return {name: value for name, value in settings.items() if name not in IGNORED_BY.get(mode, ())}
