"""Whether two converted model folders hold the same weights bit for bit (and the same config but for
`_name_or_path`): how the streaming conversion (a1c56fe) was checked against transformers' for smollm2 and
both Qwen models.

    python benchmarks/results/issue12/fetch_memory/compare_folders.py OLD_FOLDER NEW_FOLDER

Prints the tensor counts, names in only one of them, tensors that differ and config keys that differ;
exits 1 where anything but `_name_or_path` differs."""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def weights(folder: Path) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def main() -> int:
    a, b = Path(sys.argv[1]), Path(sys.argv[2])
    wa, wb = weights(a), weights(b)
    unequal = sorted(k for k in wa.keys() & wb.keys() if not torch.equal(wa[k], wb[k]))
    ca, cb = (json.loads((f / "config.json").read_text()) for f in (a, b))
    config = {k: (ca.get(k), cb.get(k)) for k in ca.keys() | cb.keys()
              if ca.get(k) != cb.get(k) and k != "_name_or_path"}
    print(json.dumps({"tensors": [len(wa), len(wb)], "only_in_one": sorted(wa.keys() ^ wb.keys()),
                      "unequal": unequal, "config_differs": config}))
    return 1 if unequal or config or wa.keys() ^ wb.keys() else 0


if __name__ == "__main__":
    sys.exit(main())
