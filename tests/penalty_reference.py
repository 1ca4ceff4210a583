"""vLLM's presence, frequency and repetition penalties written out token by token, the reference that
speculation/penalties.py and the engine's sampled distributions are tested against."""
import torch


def reference_penalized(row: torch.Tensor, prompt: list[int], generated: list[int], presence: float,
                        frequency: float, repetition: float) -> torch.Tensor:
    """One row's logits after `prompt` and `generated`, token by token: the repetition penalty on every
    token seen in either (divided where positive, multiplied otherwise), then frequency x count and
    presence where generated."""
    out = row.clone()
    for token in range(len(out)):
        count = generated.count(token)
        if token in prompt or count:
            out[token] = out[token] / repetition if out[token] > 0 else out[token] * repetition
        out[token] -= frequency * count + presence * (count > 0)
    return out
