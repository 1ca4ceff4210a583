"""Would the draft propose better at another temperature than the request's? Speculative sampling stays
exact for any proposal distribution q that is the one sampled from, so the draft could sample at the
request's temperature T times a factor c; a draft that is over- or under-confident against its target
would then be accepted more often. Teacher-forced on --sequences stretches of --length tokens of a text,
both models over the whole stretch, this prints as JSON the expected acceptance of one draw,
sum_x min(p_T(x), q_{T*c}(x)), per temperature T and factor c (1.0: what the engine does).

    python benchmarks/draft_temperature.py --text ../shared/data/austen-persuasion.txt [--sequences 6]
        [--length 512] [--model smollm2] [--draft triforce/drafts/smollm2]
"""
import argparse
import json

import torch

from triforce.cache.full import FullKVCache
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.models.tokenizer import load_tokenizer
from triforce.speculation.sampling import probabilities

TEMPERATURES = (0.6, 1.0)
FACTORS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5)


def all_logits(model, row: torch.Tensor) -> torch.Tensor:
    return model(row, FullKVCache(model.config, len(row), model.dtype, "cpu"), logits_for="all").float()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True)
    p.add_argument("--sequences", type=int, default=6)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--draft", default="triforce/drafts/smollm2")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    folder = resolve_model(args.model)
    target, draft = load_model(folder, "bfloat16"), load_model(resolve_model(args.draft), "bfloat16")
    with open(args.text) as f:
        text = f.read()
    ids = load_tokenizer(folder, target.config.vocab_size)(text[len(text) // 3:])["input_ids"]  # past the openings a draft may know best
    accepted = {(t, c): 0.0 for t in TEMPERATURES for c in FACTORS}
    for i in range(args.sequences):
        row = torch.tensor(ids[i * args.length:(i + 1) * args.length])
        p_logits, q_logits = all_logits(target, row), all_logits(draft, row)
        for t in TEMPERATURES:
            p_t = probabilities(p_logits, t)
            for c in FACTORS:
                accepted[t, c] += torch.minimum(p_t, probabilities(q_logits, t * c)).sum().item()
    tokens = args.sequences * args.length
    print(json.dumps({"model": args.model, "draft": args.draft, "text": args.text, "tokens": tokens,
                      "expected_acceptance": {f"T={t}": {f"x{c}": round(accepted[t, c] / tokens, 4) for c in FACTORS}
                                              for t in TEMPERATURES}}, indent=1))


if __name__ == "__main__":
    main()
