"""Files written whole or not at all."""
from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """Writes `text` to `path` through a partial file of this process's, renamed over it: a reader, or a
    process writing the same file at once, sees the old file or the new one, never half of one (a torn
    file failed every later run). A write that fails leaves no partial file behind."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
