"""held_bytes: the bytes of the tensors a request's objects hold, each storage counted once."""
import torch

from triforce.models.rope import RotaryEmbedding


def held_bytes(objects) -> int:
    """Bytes of the tensors reachable from `objects` through attributes, lists and dicts (not the models'
    nor their RoPE tables, which every request shares)."""
    seen_objects, storages, total = set(), set(), 0
    stack = list(objects)
    while stack:
        obj = stack.pop()
        if id(obj) in seen_objects or isinstance(obj, (torch.nn.Module, RotaryEmbedding)):
            continue
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("triforce"):
            stack.extend(vars(obj).values())
    return total
