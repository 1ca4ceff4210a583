"""Per-request metrics: timings and, per tier, proposals checked, acceptances and accepted lengths."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TierStats:
    """Counts for the proposals a tier *checked* (those of the tier below it)."""
    name: str  # the checking tier
    drafter: str  # the tier whose proposals it checks
    proposed: int = 0  # tokens checked (a tree's nodes, a chain's length)
    accepted: int = 0
    checks: int = 0
    accepted_lengths: dict[int, int] = field(default_factory=dict)  # accepted length -> verifications
    seconds: float = 0.0  # time in this tier's forward passes

    def record(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        self.checks += 1
        self.accepted_lengths[accepted] = self.accepted_lengths.get(accepted, 0) + 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed: for trees, most nodes are siblings that cannot all be accepted."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens gained per check, the recovered or bonus token included (vLLM's mean acceptance length)."""
        return (self.accepted + self.checks) / self.checks if self.checks else 0.0

    def accepted_per_depth(self) -> list[int]:
        """Checks that accepted a token at depth d = 1, 2, ... (a chain's position d)."""
        deepest = max(self.accepted_lengths, default=0)
        return [sum(n for length, n in self.accepted_lengths.items() if length >= d) for d in range(1, deepest + 1)]

    @classmethod
    def merged(cls, stats: list["TierStats"]) -> "TierStats":
        """One tier's counts over several requests (a batch: they ran together, so seconds is the most)."""
        out = cls(stats[0].name, stats[0].drafter, seconds=max(s.seconds for s in stats))
        for s in stats:
            out.proposed, out.accepted, out.checks = out.proposed + s.proposed, out.accepted + s.accepted, \
                out.checks + s.checks
            for length, n in s.accepted_lengths.items():
                out.accepted_lengths[length] = out.accepted_lengths.get(length, 0) + n
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, "drafter": self.drafter, "proposed": self.proposed, "accepted": self.accepted,
                "acceptance_rate": round(self.acceptance_rate, 4), "checks": self.checks,
                "mean_accepted_length": round(self.mean_accepted_length, 4),
                "proposed_per_check": round(self.proposed / self.checks, 2) if self.checks else 0.0,
                "accepted_per_depth": self.accepted_per_depth(),
                "accepted_length_histogram": {str(k): v for k, v in sorted(self.accepted_lengths.items())},
                "seconds": round(self.seconds, 4)}


@dataclass
class RequestMetrics:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    cached_prompt_tokens: int = 0  # restored from the prefix store instead of prefilled
    decode_s: float = 0.0
    retrieval_rebuilds: int = 0
    tiers: list[TierStats] = field(default_factory=list)
    # with a remote worker group: control-plane traffic (ZeroMQ, both directions), the KV the bulk link
    # carried (torch.distributed, workers/bulk.py) and time waiting on them
    control_messages: int | None = None
    control_bytes: int | None = None
    bulk_bytes: int | None = None
    worker_wait_s: float | None = None
    auto: list[dict] | None = None  # --mode auto: each change of plan (when, which tiers and gammas, and why)
    lookup: dict | None = None  # --lookup: the prompt lookup's n, candidates, right ones and final weight

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
                "prefill_s": round(self.prefill_s, 4),
                "cached_prompt_tokens": self.cached_prompt_tokens, "decode_s": round(self.decode_s, 4),
                "tokens_per_s": round(self.tokens_per_s, 3), "retrieval_rebuilds": self.retrieval_rebuilds,
                "tiers": [t.to_dict() for t in self.tiers],
                **({} if self.control_messages is None else {
                    "control_messages": self.control_messages, "control_bytes": self.control_bytes,
                    "control_bytes_per_token": round(self.control_bytes / max(1, self.generated_tokens)),
                    "bulk_bytes": self.bulk_bytes,
                    "worker_wait_s": round(self.worker_wait_s, 4)}),
                **({} if self.auto is None else {"auto": self.auto}),
                **({} if self.lookup is None else {"lookup": self.lookup})}
