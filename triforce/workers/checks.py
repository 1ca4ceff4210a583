"""What the leader of a worker group checks of a request before it broadcasts it (worker.py), so that every
rank executes it or none does: a bad request gets an error reply and no rank enters a collective for it.
`LeaderChecks` is a part of VerifierWorker, which holds the `model`, `tp`, `caches`, `prefixes`,
`saved_queries`, `verified` and `forwards` these read."""
from __future__ import annotations

import os

import torch

from ..cache.retrieval import selects_chunks
from ..memory import available_bytes, release_freed, size_text
from ..models.cuda_graphs import MAX_TOKENS as GRAPH_TOKENS
from ..models.cuda_graphs import forwards_bytes
from ..models.parallel import TensorParallel
from ..models.rope import POSITION_MARGIN
from ..step import check_parents, check_path
from .protocol import REQUESTS

MAX_SEQUENCES = 256  # sequences a group holds at once


class RequestError(ValueError):
    """A well-formed request that this worker cannot serve (wrong position, too long, ...)."""


class NoRoom(RequestError):
    """A sequence that does not fit beside the ones the group holds now; it may once one of them ends."""


class NeverFits(RequestError):
    """A sequence whose cache the group's memory cannot hold even alone (a server's 413)."""


def sharing_memory(tp: TensorParallel, device: torch.device | str) -> int:
    """How many of the group's ranks take their memory where this rank does: on a GPU, one (its own); on a
    CPU, the group's ranks on this host (torchrun's LOCAL_WORLD_SIZE, which counts a coordinator there too:
    all W of `--workers W`; every rank where it is not set, under a launcher other than torchrun)."""
    if torch.device(device).type != "cpu":
        return 1
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return min(tp.size, int(local)) if local.isdecimal() and int(local) > 0 else tp.size


def check_kept_path(begin: int, parents: list[int] | None, start: int, path: list[int]) -> None:
    """A commit keeps, of the tokens of a verify at `begin` (a tree of `parents`), those before `start` and then
    `path` (indices past `start`): a path from a root down the tree. Where the tree was cut since (parents
    None: a commit or a prefill came after the verify) it may only cut the cache short."""
    if parents is None:
        if path:
            raise ValueError("commit of a path, but the sequence's last request was no verify")
        return
    kept = list(range(start - begin)) + [start - begin + p for p in path]
    if any(node >= len(parents) or parents[node] != (kept[k - 1] if k else -1) for k, node in enumerate(kept)):
        raise ValueError("commit of a path that does not go from a root down the last verify's tree")


class LeaderChecks:
    def check(self, kind: str, body: dict) -> None:
        """Raises RequestError (NoRoom, NeverFits: the memory) where the request cannot be served as it is."""
        if kind not in REQUESTS:  # a reply sent to the leader: every rank would fail executing it
            raise RequestError(f"{kind!r} is not a request")
        if kind in ("end", "prefill", "commit", "refresh", "kv", "save_query", "restore_query") \
                and body["seq"] not in self.caches:
            raise RequestError(f"{kind} of sequence {body['seq']}, which was not started")
        if kind == "start":
            most = self.model.config.max_positions + POSITION_MARGIN  # (the speculation slack's room)
            if not 0 < body["capacity"] <= most:
                raise RequestError(f"capacity {body['capacity']} outside (0, {most}]")
            if body["seq"] in self.caches:  # its cache would be replaced under it
                raise RequestError(f"sequence {body['seq']} is running already (another coordinator on this group?)")
            forwards = body["forwards"]
            if len(forwards) > 2 * GRAPH_TOKENS or not all(0 < n <= GRAPH_TOKENS for n in forwards):
                raise RequestError(f"forwards of 1 to {GRAPH_TOKENS} tokens, at most {2 * GRAPH_TOKENS} of them")
            if len(self.caches) >= MAX_SEQUENCES:
                raise NoRoom(f"the group holds {MAX_SEQUENCES} sequences already; end one first")
            ranks, free = self._room()
            graphs = self._graph_bytes(body["capacity"], forwards)
            need = ranks * self.model.kv_bytes_per_token * body["capacity"] + graphs
            if free is not None and need > self.memory_share * free and self.model.device.type == "cpu":
                release_freed(every_s=0)  # what glibc keeps of ended sequences' caches first
                ranks, free = self._room()
            if free is not None and need > self.memory_share * free:
                refusal = NoRoom if self.caches else NeverFits  # for now, or for good
                raise refusal(f"a cache of {body['capacity']} tokens{' and its graphed forwards' if graphs else ''} "
                              f"needs {need / 2**30:.1f} GiB"
                              f"{f' for the {ranks} ranks' if ranks > 1 else ' per rank'}; "
                              f"{free / 2**30:.1f} GiB is free on the leader's {self.model.device}")
        if kind == "restore_query" and body["seq"] not in self.saved_queries:
            raise RequestError(f"restore_query of sequence {body['seq']}, which saved none")
        if kind == "prefill":
            self._check_tokens(kind, body["seq"], body["tokens"], body["start"])
        if kind == "verify":
            seqs = body["seqs"]
            if not seqs or len(set(seqs)) != len(seqs) or \
                    not len(body["tokens"]) == len(body["parents"]) == len(body["starts"]) == len(seqs):
                raise RequestError("verify needs distinct sequences, each with its tokens, parents and start")
            for seq, tokens, parents, start in zip(seqs, body["tokens"], body["parents"], body["starts"]):
                if seq not in self.caches:
                    raise RequestError(f"verify of sequence {seq}, which was not started")
                self._check_tokens(kind, seq, tokens, start)
                try:
                    check_parents(parents, len(tokens))
                except ValueError as exc:
                    raise RequestError(str(exc)) from None
        length = self.caches[body["seq"]].length if kind in ("commit", "kv", "refresh") else 0
        if kind == "commit":
            try:
                begin, parents = self.verified.get(body["seq"], (0, None))
                if not begin <= body["start"] <= length:
                    raise ValueError(f"commit at {body['start']}, but the cache holds {length} tokens, of which "
                                     f"{begin} were committed before its last verify")
                check_path(body["path"], length - body["start"])
                check_kept_path(begin, parents, body["start"], body["path"])
            except ValueError as exc:
                raise RequestError(str(exc)) from None
        if kind == "kv" and not 0 <= body["start"] <= body["stop"] <= length:
            raise RequestError(f"kv range [{body['start']}, {body['stop']}) outside [0, {length}]")
        if kind == "refresh" and (body["chunk_size"] < 1 or body["budget"] < 2 * body["chunk_size"]
                                  or body["budget"] % body["chunk_size"] or body["start"] != length):
            raise RequestError(f"refresh needs a budget of two chunks or more, a multiple of the chunk size, "
                               f"at the cache's length {length}")
        if kind == "refresh" and selects_chunks(length, body["budget"], body["chunk_size"]) and \
                self.caches[body["seq"]].last_query[0] is None:  # (its KV all restored from the prefix store)
            raise RequestError(f"refresh chooses chunks by the query of the last forward, and no forward has run "
                               f"on sequence {body['seq']} yet")
        if kind == "refresh" and selects_chunks(length, body["budget"], body["chunk_size"]):
            # The first choice that selects chunks allocates the cache's chunk means (1 / (2 chunk_size) of
            # its KV): failing there, on every rank, it would end the group and every request on it
            ranks, free = self._room()
            need = ranks * self.caches[body["seq"]].means_bytes(body["chunk_size"])
            if free is not None and need > self.memory_share * free:
                raise RequestError(f"the chunk means of sequence {body['seq']} need {size_text(need)}; "
                                   f"{size_text(free)} is free on the leader's {self.model.device}")

    def _graph_bytes(self, capacity: int, forwards: list[int]) -> int:
        """The buffers of the static forwards a sequence's forwards of these token counts may each make over
        its cache, where this group replays forwards as CUDA graphs (one rank on a GPU: models/cuda_graphs.py;
        a sharded model runs its own): on a 24 GB GPU beside a batch of Qwen2.5's caches, their float32
        logits alone came to gigabytes uncounted."""
        if self.model.forward_graphs is None:
            return 0
        return forwards_bytes(self.model.config, capacity, forwards, self.model.dtype.itemsize)

    def _graphs_to_come(self) -> int:
        """What the running sequences' static forwards may still allocate: each is made at its sequence's
        first forward of its size, so a sequence started before its first forwards has none yet, which the
        free memory does not show."""
        graphs = self.model.forward_graphs
        if graphs is None:
            return 0
        to_come = 0
        for seq, cache in self.caches.items():  # (its declared sizes not made yet: subtracting the bytes of all
            made = graphs.made(cache)  # made over its buffers, an earlier cache's sizes among them, hid them)
            to_come += self._graph_bytes(cache.capacity, [n for n in self.forwards.get(seq, []) if n not in made])
        return to_come

    def _room(self) -> tuple[int, int | None]:
        """How many of the group's ranks take their memory where the leader does (on a CPU, all those on its
        host, at once: its own share alone let a rank's allocation fail), and the bytes free there beside
        what the prefix stores may still grow into and the running sequences' static forwards may still
        take (None: unknown)."""
        ranks = sharing_memory(self.tp, self.model.device)
        free = available_bytes(self.model.device)
        if free is not None:
            free = max(0, free - (ranks * self.prefixes.room() if self.prefixes is not None else 0)
                       - self._graphs_to_come())
        return ranks, free

    def _check_tokens(self, kind: str, seq: int, tokens: list[int], start: int) -> None:
        cache = self.caches[seq]
        if start != cache.length:
            raise RequestError(f"{kind} at position {start}, but sequence {seq}'s cache holds {cache.length} tokens")
        if not tokens or cache.length + len(tokens) > cache.capacity:
            raise RequestError(f"{kind} of {len(tokens)} tokens does not fit the cache "
                               f"({cache.length} of {cache.capacity})")
        if min(tokens) < 0 or max(tokens) >= self.model.config.vocab_size:
            raise RequestError("token id outside the vocabulary")
