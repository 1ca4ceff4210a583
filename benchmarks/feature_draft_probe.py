"""Would a draft that reads the target's own hidden states be accepted more often than the shipped
token-level draft? A probe of EAGLE's draft (Li et al., arXiv 2401.15077), not the engine.

EAGLE's draft is one decoder layer over the target's features: at position t it takes the target's last
hidden state f_t (here after the final norm, the input of the output head) and the embedding of the next
token x_{t+1}, and predicts f_{t+1}; the target's own head turns a prediction into a token. Deeper in a
chain it reads its own predictions, as it would while proposing. The probe

1. runs the target over --chunks pieces of 1,024 tokens spread over five Austen novels (TRAIN; *Emma* left
   out, as the shipped draft's training left it) and keeps their features (stored in --work, reused);
2. trains the layer (the target's embedding and head frozen, the head restricted to the shipped draft's
   kept vocabulary so both drafts propose from the same tokens) for --steps steps of --batch windows of
   --window tokens: smooth-L1 on the features plus --cls-weight times the cross-entropy against the
   target's distribution, inputs jittered by +-0.1 (EAGLE's recipe), and with --rollout R, R more passes
   that read the pass before's predictions as features (as EAGLE-3's training-time test trains for depth);
   checkpoints in --work, so a rerun resumes (a copied checkpoint continues another run);
3. scores it as `draft_layout.py` scores the shipped draft: 8 prompts of 1,024 tokens of *Emma* from token
   20,000 + 9,000 i, the last 256 positions, against the target's argmax (top-1 agreement) and the expected
   acceptance of one draw at 0.6 (sum of min(p, q)); at depth 1 (the target's features up to the token
   before) and depths 2-4 (the chain's own predicted features in place of the target's, its tokens the
   text's: teacher-forced), beside the shipped draft reading the whole prompt (depth does not change a
   token-level draft's inputs under teacher forcing); and each draft's mean leading run of agreements over
   the 4 depths (`chain_run`: the tokens a greedy chain of 4 would have accepted, bonus not counted).

    python benchmarks/feature_draft_probe.py --work DIR [--chunks 256] [--steps 1500] [--batch 8]
        [--window 512] [--lr 1e-3] [--cls-weight 0.1] [--rollout 0]
        [--eval-only]

Prints a JSON line per evaluation (every --eval-every steps and at the end; --eval-only scores the checkpoint
in --work and stops). docs/draft.md, *A draft over the target's own features*, has the results."""
import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from triforce.kernels.fused import rope
from triforce.llm_models import DEFAULT_DRAFTS
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.models.tokenizer import load_tokenizer
from triforce.speculation.sampling import probabilities

from draft_on_policy import logits  # the whole row's logits, in float32

CHUNK = 1024
TRAIN = [f"../shared/data/austen-{n}.txt" for n in
         ("prideprejudice", "sensesensibility", "mansfieldpark", "persuasion", "northangerabbey")]
EVAL_PROMPTS, EVAL_POSITIONS, DEPTH = 8, 256, 4


def features(target, row: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's post-norm hidden states [n, d] and its logits [n, V], float32."""
    seen = {}
    hook = target.norm.register_forward_hook(lambda m, i, o: seen.__setitem__("h", o.float()))
    try:
        out = logits(target, row)
    finally:
        hook.remove()
    return seen["h"].clone(), out.clone()


def rotated(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """x [..., T, D] rotated at positions [T] (or [P, 1, T], broadcast), the halves' layout of the models."""
    d = x.shape[-1]
    angles = positions.float()[..., None] * theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    return rope(x, torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1))


class FeatureDraft(nn.Module):
    """fc(f_t, embed(x_{t+1})) -> one pre-norm Llama decoder layer -> predicted f_{t+1}."""

    def __init__(self, d: int, heads: int, kv_heads: int, inter: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.fc = nn.Linear(2 * d, d)
        self.ln1, self.ln2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.q = nn.Linear(d, heads * self.hd, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(heads * self.hd, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * inter, bias=False)
        self.down = nn.Linear(inter, d, bias=False)

    def project(self, f: torch.Tensor, e: torch.Tensor, positions: torch.Tensor):
        """x, q, k, v of inputs [..., T, d] at positions."""
        x = self.fc(torch.cat([f, e], -1))
        h = self.ln1(x)
        *lead, t, _ = h.shape
        q = self.q(h).view(*lead, t, self.heads, self.hd).transpose(-2, -3)
        k, v = self.kv(h).view(*lead, t, 2, self.kv_heads, self.hd).unbind(-3)
        k, v = k.transpose(-2, -3), v.transpose(-2, -3)
        return x, rotated(q, positions), rotated(k, positions), v

    def finish(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None) -> torch.Tensor:
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        x = x + self.o(a.transpose(-2, -3).flatten(-2))
        g, u = self.gate_up(self.ln2(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)

    def forward(self, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """Causal over a whole window: f, e [B, T, d] -> predictions [B, T, d]."""
        x, q, k, v = self.project(f, e, torch.arange(f.shape[-2]))
        return self.finish(x, q, k, v)


def collect(target, ids: list[int], chunks: int, path: Path) -> dict:
    if path.is_file():
        return torch.load(path)
    starts = torch.linspace(0, len(ids) - CHUNK - 1, chunks).long().tolist()
    feats, toks, began = [], [], time.time()
    for i, s in enumerate(starts):
        f, _ = features(target, ids[s:s + CHUNK])
        feats.append(f.bfloat16())
        toks.append(torch.tensor(ids[s:s + CHUNK]))
        if i % 32 == 31:
            print(json.dumps({"collected": i + 1, "of": chunks, "s": round(time.time() - began, 1)}), flush=True)
    data = {"feats": torch.stack(feats), "tokens": torch.stack(toks)}
    torch.save(data, path)
    return data


def depth_predictions(model, f: torch.Tensor, e: torch.Tensor, starts: torch.Tensor, own: bool = True):
    """The draft's predictions of f at positions starts + j, j < DEPTH: depth 1 (j = 0) from the target's
    features up to the position before; deeper from the chain's own predicted features in the slots from
    the start (own=False: the target's there too, which must give the whole-window pass's predictions)."""
    n = f.shape[0]
    x, q, k, v = model.project(f[:-1], e[1:], torch.arange(n - 1))  # slot t = (f_t, x_{t+1}) predicts f_{t+1}
    out = model.finish(x, q, k, v)  # [n-1, d]
    pred, preds = out[starts - 1], [out[starts - 1]]
    kb, vb = k.expand(len(starts), *k.shape).clone(), v.expand(len(starts), *v.shape).clone()
    rows = torch.arange(len(starts))
    for j in range(1, DEPTH):
        t = starts + j - 1  # the input slot: (the chain's prediction of f_t, the text's x_{t+1})
        xj, qj, kj, vj = model.project((pred if own else f[t])[:, None], e[t + 1][:, None], t[:, None, None])
        kb[rows, :, t], vb[rows, :, t] = kj[:, :, 0], vj[:, :, 0]
        mask = torch.arange(n - 1)[None, :] <= t[:, None]
        pred = model.finish(xj, qj, kb, vb, mask[:, None, None, :])[:, 0]
        preds.append(pred)
    return preds, out


def evaluate(model, target, head, kept, embed, prompts, shipped: list[torch.Tensor]) -> dict:
    """Per depth: top-1 agreement with the target's argmax and expected acceptance at 0.6, of the feature draft
    (head restricted to the kept tokens, as the shipped draft's) and of the shipped draft; and the mean
    leading run of agreements over the DEPTH depths (a greedy chain's accepted tokens, teacher-forced)."""
    sums, runs = torch.zeros(DEPTH, 4), torch.zeros(2)
    model.eval()
    with torch.no_grad():
        for row, qd in zip(prompts, shipped):
            f, lt = features(target, row)
            g, pt = lt.argmax(-1), probabilities(lt, 0.6)
            starts = torch.arange(len(row) - EVAL_POSITIONS, len(row) - DEPTH + 1)  # scored at depth 1
            preds, _ = depth_predictions(model, f, embed[torch.tensor(row)], starts)
            agree = torch.zeros(2, DEPTH, len(starts))
            for j, pred in enumerate(preds):
                pos = starts + j  # the position whose next token depth j + 1 predicts
                proposal = torch.full((len(starts), lt.shape[-1]), float("-inf"))
                proposal[:, kept] = pred.float() @ head[kept].T
                for col, dl in ((0, proposal), (1, qd[pos])):
                    agree[col, j] = (dl.argmax(-1) == g[pos]).float()
                    sums[j, 2 * col] += agree[col, j].sum()
                    sums[j, 2 * col + 1] += torch.minimum(pt[pos], probabilities(dl, 0.6)).sum()
            runs += agree.cumprod(1).sum((1, 2))
    model.train()
    k = len(prompts) * (EVAL_POSITIONS - DEPTH + 1)
    return {"chain_run": {"feature": round(float(runs[0]) / k, 4), "shipped": round(float(runs[1]) / k, 4)},
            **{f"depth{j + 1}": {"feature_top1": round(float(sums[j, 0]) / k, 4),
                                 "feature_accept_0.6": round(float(sums[j, 1]) / k, 4),
                                 "shipped_top1": round(float(sums[j, 2]) / k, 4),
                                 "shipped_accept_0.6": round(float(sums[j, 3]) / k, 4)} for j in range(DEPTH)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="folder for the features and checkpoints")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--chunks", type=int, default=256)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--cls-weight", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-only", action="store_true", help="score --work's checkpoint and stop")
    p.add_argument("--rollout", type=int, default=0,
                   help="extra passes per step whose inputs are the pass before's predicted features "
                        "(the draft's own, as deeper in a chain), each with its own loss")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    target_path = resolve_model(args.model)
    target = load_model(target_path, "bfloat16", torch.device("cpu"))
    tok = load_tokenizer(target_path, target.config.vocab_size)
    draft = load_model(resolve_model(DEFAULT_DRAFTS[args.model]), "bfloat16", torch.device("cpu"))
    kept = draft.vocab.token_ids
    head = target.lm_head.weight.detach().float().clone()
    embed = target.embed_tokens.weight.detach().float().clone()
    ids = [t for path in TRAIN for t in tok(open(path).read())["input_ids"]]
    data = collect(target, ids, args.chunks, work / f"features_{args.chunks}.pt")
    emma = tok(open("../shared/data/austen-emma.txt").read())["input_ids"]
    prompts = [emma[20000 + i * 9000:20000 + i * 9000 + CHUNK] for i in range(EVAL_PROMPTS)]
    shipped = [logits(draft, row).clone() for row in prompts]  # its logits, a list beside the prompts
    cfg = target.config
    model = FeatureDraft(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    ckpt, step = work / "checkpoint.pt", 0
    if ckpt.is_file():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    if args.eval_only:
        print(json.dumps({"step": step, **evaluate(model, target, head, kept, embed, prompts, shipped)}))
        return
    head_kept = head[kept]
    feats, tokens = data["feats"], data["tokens"]
    began = time.time()
    while step < args.steps:
        lr = args.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        rows = torch.randint(0, feats.shape[0], (args.batch,))
        offs = torch.randint(0, CHUNK - args.window, (args.batch,))
        idx = offs[:, None] + torch.arange(args.window + 1)
        f = feats[rows[:, None], idx].float()
        x = tokens[rows[:, None], idx]
        inp = f[:, :-1] + (torch.rand_like(f[:, :-1]) - 0.5) * 0.2
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            want = torch.softmax((f[:, 1:] @ head_kept.T).float(), -1)
        loss = 0.0
        for _ in range(1 + args.rollout):  # then again with its own predictions as every slot's features
            with torch.autocast("cpu", dtype=torch.bfloat16):
                pred = model(inp, embed[x[:, 1:]])
                guess = (pred @ head_kept.T).float()
            reg = F.smooth_l1_loss(pred.float(), f[:, 1:])
            cls = -(want * torch.log_softmax(guess, -1)).sum(-1).mean()
            loss = loss + reg + args.cls_weight * cls
            inp = torch.cat([inp[:, :1], pred[:, :-1].float()], 1)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            print(json.dumps({"step": step, "reg": round(reg.item(), 4), "cls": round(cls.item(), 4),
                              "s_per_step": round((time.time() - began) / 50, 2)}), flush=True)
            began = time.time()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
        if step % args.eval_every == 0 or step == args.steps:
            print(json.dumps({"step": step, "chunks": args.chunks, "window": args.window, "lr": args.lr,
                              "cls_weight": args.cls_weight, "rollout": args.rollout,
                              **evaluate(model, target, head, kept, embed, prompts, shipped)}), flush=True)


if __name__ == "__main__":
    main()
