"""`triforce serve` with a thread that records, every PERIOD_S seconds, what its memory holds: VmRSS, glibc's
heap (mallinfo2: bytes in use, free bytes the heap keeps, bytes in mmapped blocks), the live torch tensors
(bytes of their distinct storages, and the shapes holding most), and the Python object types that
grew most since the last record. For telling a leak (live tensors or objects grow) from what the heap
keeps (free bytes grow) in a soak (docs/serving.md, Memory over hours).

    PROBE_OUT=probe.jsonl python benchmarks/serve_memory_probe.py [serve flags]   # e.g. --port 8931

benchmarks/results/soak/soak.sh runs it in place of `triforce serve` when SERVE="python
benchmarks/serve_memory_probe.py" is set. Records go to $PROBE_OUT (default serve_memory_probe.jsonl).
"""
import collections
import ctypes
import gc
import json
import os
import sys
import threading
import time
import warnings

import torch

PERIOD_S = float(os.environ.get("PROBE_PERIOD_S", "60"))


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap() -> dict:
    """glibc's totals over all arenas (GB): in use, free but kept, mmapped; {} where there is no mallinfo2."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = MallInfo2
    m = fn()
    return {"in_use_gb": m.uordblks / 1e9, "free_kept_gb": m.fordblks / 1e9, "mmapped_gb": m.hblkhd / 1e9}


def rss_gb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1e6


def tensors() -> dict:
    """Bytes of the distinct storages of live tensors, and the 8 shapes whose tensors hold most."""
    seen, by_shape = {}, collections.Counter()
    with warnings.catch_warnings():  # isinstance on torch's deprecated aliases warns
        warnings.simplefilter("ignore")
        live = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in live:
        if obj.device.type == "cpu":
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen:
                seen[storage.data_ptr()] = storage.nbytes()
                by_shape[str(tuple(obj.shape))] += storage.nbytes()
    return {"tensor_gb": sum(seen.values()) / 1e9, "storages": len(seen),
            "top_shapes_mb": {k: round(v / 1e6, 1) for k, v in by_shape.most_common(8)}}


def record(out, last_types: collections.Counter) -> collections.Counter:
    types = collections.Counter(type(o).__name__ for o in gc.get_objects())
    grown = {k: types[k] - last_types.get(k, 0) for k in types}
    rec = {"t": round(time.time(), 1), "rss_gb": round(rss_gb(), 3), **{k: round(v, 3) for k, v in heap().items()},
           **tensors(), "types_grown": dict(sorted(grown.items(), key=lambda kv: -kv[1])[:10])}
    out.write(json.dumps(rec) + "\n")
    out.flush()
    return types


def watch(path: str) -> None:
    with open(path, "a") as out:
        last = collections.Counter()
        while True:
            try:
                last = record(out, last)
            except Exception as exc:  # the probe must not end the server
                out.write(json.dumps({"error": repr(exc)}) + "\n")
            time.sleep(PERIOD_S)


if __name__ == "__main__":
    from triforce.launch.cli import main

    threading.Thread(target=watch, args=(os.environ.get("PROBE_OUT", "serve_memory_probe.jsonl"),),
                     daemon=True).start()
    sys.exit(main(["serve", *sys.argv[1:]]))
