"""The Python API, in vLLM's shape:

    from triforce import LLM, SamplingParams
    llm = LLM(model="smollm2", mode="triforce")
    out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=64, temperature=0.6))[0]
    print(out.text, out.metrics.tokens_per_s)
"""
from __future__ import annotations

import itertools
import logging
import numbers
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields, replace

from tqdm import tqdm

from .cache.prefixes import PrefixStore
from .chat import conversation_ids
from .config import DRAFT_TIER, PREFIX_CACHE_GB, ConfigError, EngineConfig, check_prefix_cache, runs_tier, sets_tier
from .sampling_params import SamplingParams
from .coordinator.batchmates import Batchmates
from .coordinator.batch import SequenceBatch
from .coordinator.hierarchy import check_draft_window
from .coordinator.channel import GroupFull
from .coordinator.proposer_weights import choose_weights
from .engine_args import take_vllm_args
from .errors import UserError
from .generation_defaults import added_eos_ids, sampling_defaults
from .memory import release_freed
from .models.config import rope_scaling_spec
from .llm_models import SELF_DRAFT, ModelChoice
from .models.hub import DEFAULT_MODEL, resolve_model
from .models.loader import DTYPE_CHOICES, checkpoint_dtype, resolve_device, resolve_dtype
from .models.quantized import int8_twin
from .models.tokenizer import load_tokenizer
from .request import Request, RequestOutput
from .request_checks import RequestChecks
from .request_memory import RequestMemory
from .speculation.guided import Grammars

log = logging.getLogger("triforce")

class LLM(ModelChoice, RequestChecks, RequestMemory):
    """vLLM's LLM: a target, its draft and the engine settings; `generate` and `chat` run requests. Which
    weights it loads: ModelChoice; what a request may ask of it: RequestChecks; whether requests fit in
    memory: RequestMemory."""

    def __init__(self, model: str | os.PathLike = DEFAULT_MODEL, draft: str | os.PathLike | None = None,
                 mode: str = "auto", dtype: str = "auto", device: str | None = None, workers=None,
                 rope_scaling: str | None = None, revision: str | None = None, draft_revision: str | None = None,
                 prefix_cache_gb: float = PREFIX_CACHE_GB, generation_config: str | os.PathLike = "auto",
                 **engine_settings):
        """`engine_settings` are EngineConfig fields (gamma1, gamma2, budget, chunk_size, ...). `workers`: a
        ControlChannel to a worker group that verifies with the full cache (launch/distributed.py);
        None verifies in this process. `rope_scaling`: 'KIND:FACTOR' (linear, dynamic, yarn, llama3)
        stretches target and draft alike over FACTOR times their positions. `model` and `draft` may be
        Hugging Face ids (org/name), resolved in the hub cache (HF_HOME, HF_HUB_OFFLINE) at `revision` and
        `draft_revision` (a branch, tag or commit; default the main branch). `prefix_cache_gb`: the target KV of recent prompts kept so that a prompt beginning
        the same way skips prefilling that part (0: off). With `workers` the group keeps them under its own
        bound (run_worker's `prefix_bytes`: serve's and batch's --prefix-cache-gb), and this one is unused.
        `generation_config` (vLLM's): where requests' sampling defaults come from, 'auto' (the model's
        generation_config.json), 'vllm' (none) or a folder (generation_defaults.py)."""
        if dtype not in DTYPE_CHOICES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPE_CHOICES)} (got {dtype!r})")
        vllm = take_vllm_args(engine_settings)
        self.memory_share, self._seeds = vllm.memory_share, vllm.seeds
        unknown = set(engine_settings) - {f.name for f in fields(EngineConfig)}
        if unknown:
            raise ConfigError(f"unknown engine settings: {', '.join(sorted(unknown))}")
        self.device = resolve_device(device)
        if workers is not None and not hasattr(workers, "handshake"):
            raise ConfigError(f"workers must be a channel to a worker group (launch/distributed.py sets one: "
                              f"`triforce ... --workers N`), or None (got {workers!r})")
        self.workers = workers
        self._request_ids = itertools.count()
        asked = EngineConfig(mode=mode, **engine_settings)  # fail on bad settings before loading anything
        asked.refuse_unused(draft)
        check_prefix_cache(prefix_cache_gb, vllm.prefix_caching)
        self.rope_scaling = None if rope_scaling is None else rope_scaling_spec(rope_scaling)
        self._check_revisions([(model, revision), (draft, draft_revision), (vllm.tokenizer, vllm.tokenizer_revision)],
                              draft is not None, draft_revision)
        self.model_path = resolve_model(model, revision)
        # 'auto' decided once, for target and draft alike (by the device, and on a GPU the target's checkpoint)
        self.dtype = resolve_dtype(dtype, self.device, checkpoint_dtype(self.model_path))
        if getattr(workers, "dtype", None) not in (None, self.dtype):  # (--dtype auto on other devices: exact)
            log.warning("the worker group runs the target in %s and this process (the draft and the retrieval "
                        "tier) in %s: the output follows the group's target, and the retrieval tier's proposals "
                        "part from it more; give --dtype to run both alike", workers.dtype, self.dtype)
        self.draft_path = self._choose_draft(model, draft, draft_revision, mode)
        self.sampling_defaults = sampling_defaults(generation_config, self.model_path)
        self.added_eos_ids = added_eos_ids(generation_config, self.model_path)
        self.target = self._load(self.model_path)
        self._bound_positions(vllm.max_model_len)
        self._skipped_tokenizer = vllm.skip_tokenizer_init
        self.tokenizer = None if vllm.skip_tokenizer_init else load_tokenizer(
            self.model_path, self.target.config.vocab_size, vllm.tokenizer, vllm.tokenizer_revision)
        self.draft = self._load_draft()
        if self.draft is None and mode == "triforce":
            if asked.tree1:  # as EngineConfig reads it (the flag's "0" is 0)
                raise ConfigError("tree1 shapes the draft's proposals, and this target has no draft (mode "
                                  "'triforce' would fall back to 'retrieval', which takes tree2)")
            if asked.rounds2:  # the target would check each of the retrieval tier's rounds: rounds2 ignored
                raise ConfigError("rounds2 counts the retrieval tier's checks of a draft's proposals, and this "
                                  "target has no draft (mode 'triforce' would fall back to 'retrieval')")
            for name in DRAFT_TIER:  # (retrieval runs no draft tier: refuse_unused in mode retrieval)
                if sets_tier(name, getattr(asked, name)):
                    raise ConfigError(f"{name} sets the draft tier, and this target has no draft (mode 'triforce' "
                                      f"would fall back to 'retrieval', which runs none)")
            print("triforce: no draft model for this target; mode 'triforce' falls back to 'retrieval' (`--draft "
                  "self` would draft with the target's own weights)",
                  file=sys.stderr)
            mode = "retrieval"
        self.config = EngineConfig(mode=mode, **engine_settings)
        if self.config.auto_self_draft and self.self_draft:
            raise ConfigError("auto_self_draft adds the target as a second draft beside the draft model, and the "
                              f"draft is the target already (draft {SELF_DRAFT!r}): leave one of them out")
        if "full_layers" in engine_settings and self.config.full_layers > self.target.config.num_layers:
            raise ConfigError(f"full_layers {self.config.full_layers} is more than the target's "
                              f"{self.target.config.num_layers} layers")
        if self.draft is not None:
            check_draft_window(self.config, self.draft.config)
        # A proposing tier's weights (its model's, or an int8 twin: models/quantized.py), chosen now, so that
        # the memory checks below and a server's capacity count a twin (a config swapped in later, as the
        # bench's sweeps do, chooses at its first request)
        self._int8_twins, self._weights_chosen = {}, {}
        _ = self.retrieval_model, self.draft_model
        self.grammars = Grammars(self.tokenizer, self.target.config.vocab_size, self.eos_ids())
        if workers is not None and not vllm.prefix_caching and workers.prefix_bytes:
            raise ConfigError("enable_prefix_caching=False: a worker group keeps the prompt blocks under its own "
                              "bound (--prefix-cache-gb 0 turns it off there)")
        self.prefixes = None  # a worker group holds the target's KV itself
        if prefix_cache_gb > 0 and workers is None and vllm.prefix_caching:
            self.prefixes = PrefixStore(self._prefix_bound(prefix_cache_gb), self.config.prefill_chunk)
            token_bytes = self.target.kv_bytes_per_token
            if self.prefixes.blocks_held(token_bytes) == 0:  # a server or batch job would reuse nothing, silently
                log.warning("a prefix store of %.3g GB holds no prompt block (%d tokens of this model's keys and "
                            "values take %.1f MB): no prompt is kept for reuse", self.prefixes.max_bytes / 2**30,
                            self.config.prefill_chunk, self.config.prefill_chunk * token_bytes / 2**20)

    @property
    def retrieval_model(self):
        """The retrieval tier's weights in a mode that runs the tier (the target's otherwise): the target's, or an
        int8 copy of its layer matrices and output head (models/quantized.py), as the config says (where it
        says "auto": the faster on this machine, coordinator/proposer_weights.py), chosen and made once."""
        if not runs_tier(self.config.mode, "retrieval"):
            return self.target
        return self._proposer("retrieval", self.target, self.config.retrieval_weights)

    @property
    def draft_model(self):
        """The draft tier's weights: the draft's (None: no draft), or an int8 copy, as `retrieval_model`."""
        if not runs_tier(self.config.mode, "draft", self.draft is not None):
            return self.draft
        return self._proposer("draft", self.draft, self.config.draft_weights)

    @property
    def proposer_weights(self) -> dict[str, dict]:
        """Per proposing tier the config runs ("retrieval", "draft"): {"weights": "own" | "int8", "why": ...}
        (--json's and the bench's)."""
        chosen = {}
        _ = self.retrieval_model, self.draft_model  # (each chooses its tier's weights, where not chosen yet)
        for role in ("retrieval", "draft"):
            if not runs_tier(self.config.mode, role, self.draft is not None):
                continue
            weights = getattr(self.config, f"{role}_weights")
            chosen[role] = self._weights_chosen[role] if weights == "auto" else \
                {"weights": "int8" if weights == "int8" else "own", "why": f"set to {weights!r}"}
        return chosen

    def _proposer(self, role: str, model, weights: str):
        # (a twin made for "int8" is timed, not remade; one tier's twin of a model serves the other's, as the
        # draft `self` and the retrieval tier run the target's weights: one copy of them in int8)
        made = next((twin for twin in self._int8_twins.values() if twin.twin_of is model), None)
        if weights == "auto" and role not in self._weights_chosen:
            twin, self._weights_chosen[role] = choose_weights(model, role, twin=made)
            if twin is not model:
                self._int8_twins[role] = made = twin
        if weights == "int8" or (weights == "auto" and self._weights_chosen[role]["weights"] == "int8"):
            self._int8_twins[role] = made or int8_twin(model, role)
            return self._int8_twins[role]
        return model

    @property
    def reuses_prefixes(self) -> bool:
        """Whether recent prompts' blocks are kept for reuse: here, or by the worker group."""
        return self.prefixes is not None or (self.workers is not None and self.workers.prefix_bytes > 0)

    @property
    def rope_scaling_applied(self) -> str | None:
        """The RoPE scaling the target runs with, for a run's record: `rope_scaling` as given, else its own
        config's ('yarn:2'; a record said none where the model's config scaled it); None: none."""
        return self.rope_scaling or self.target.config.rope_spec

    def get_tokenizer(self):
        """vLLM's: the target's tokenizer (None where its folder has none)."""
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: what `generate` and `chat` take without sampling_params: SamplingParams() with the model's
        generation_config defaults (`sampling_defaults`) over it."""
        return SamplingParams(**self.sampling_defaults)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             stream: Callable[[str], None] | None = None, show_progress: bool = False, tools: list[dict] | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             chat_template_kwargs: dict | None = None, use_tqdm: bool | None = None,
             chat_template: str | None = None, lora_request=None) -> list[RequestOutput]:
        """vLLM's LLM.chat: a conversation (OpenAI's messages, {role, content}) or a list of them, each laid
        out by the tokenizer's chat template or `chat_template` (a Jinja template's text; with `tools`,
        OpenAI's function tools, as it shows them), then `generate`d: one output per conversation."""
        one = isinstance(messages, list) and bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if one else messages
        if not isinstance(conversations, list) or not conversations:
            raise UserError("'messages' must be a list of {role, content} objects, or a list of those")
        ids = [conversation_ids(self.tokenizer, c, tools, add_generation_prompt, continue_final_message,
                                chat_template_kwargs, chat_template) for c in conversations]
        outputs = self.generate(ids, sampling_params, stream, show_progress, use_tqdm, lora_request)
        for output in outputs:  # as vLLM's: the prompt the template laid out, as text
            output.prompt = self.tokenizer.decode(output.prompt_token_ids, skip_special_tokens=False,
                                                  clean_up_tokenization_spaces=False)  # (Llama 3's asks for it)
        return outputs

    def generate(self, prompts: str | Sequence[str] | Sequence[Sequence[int]] | dict | Sequence[dict] | None = None,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 stream: Callable[[str], None] | None = None, show_progress: bool = False,
                 use_tqdm: bool | None = None, lora_request=None, priority: Sequence[int] | None = None,
                 prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order, with SamplingParams.n outputs. `sampling_params` (vLLM's
        name): one SamplingParams for all prompts or one per prompt.
        The prompts run together as a batch (every tier's forward of all of them as one model call; with a
        worker group, each target check of all of them as one request), in parts when their caches do not
        all fit in memory. A prompt's output is what it would be alone (greedy; and for a seeded request, sampled
        too, outside mode auto, whose plans depend on the batch and on what the machine measured).
        `stream` (one prompt only) receives text pieces as they are committed. A prompt may also be vLLM's
        TextPrompt or TokensPrompt ({"prompt": text} or {"prompt_token_ids": ids}); `use_tqdm` is vLLM's
        name for `show_progress`: a bar over the prompts as they finish (one prompt alone: its prefill's).
        vLLM's `lora_request` and `priority` are taken unset (None; a priority of all 0s): there are no adapters
        and one priority here; older vLLM's `prompt_token_ids=` (lm-evaluation-harness's call) stands for
        `prompts`."""
        if stream is not None and not callable(stream):  # vLLM's third argument was use_tqdm once
            raise UserError(f"stream must be a function that takes each text piece (got {stream!r}); show_progress "
                            f"or use_tqdm turns the progress bar on")
        if lora_request is not None:
            raise UserError("lora_request: LoRA adapters are not supported here (merge the adapter into the "
                            "model's weights and load that folder)")
        if priority is not None and (not isinstance(priority, Sequence) or any(p != 0 for p in priority)):
            raise UserError("priority: requests have one priority here (vLLM's priority scheduling is not built; "
                            "None or a list of 0s is taken)")
        if prompt_token_ids is not None:
            if prompts is not None:
                raise UserError("give prompts or prompt_token_ids, not both")
            prompts = prompt_token_ids
        if not isinstance(prompts, (str, Sequence, dict)):
            raise UserError(f"prompts must be a string, a list of token ids or a list of those (got "
                            f"{type(prompts).__name__})")
        if isinstance(prompts, (str, dict, bytes, bytearray)) or (prompts and isinstance(prompts[0], numbers.Integral)):
            prompts = [prompts]
        prompts = [_unwrapped(p) for p in prompts]
        if priority is not None and len(priority) != len(prompts):
            raise UserError(f"priority: one per prompt ({len(priority)} for {len(prompts)} prompts), as vLLM's")
        show_progress = show_progress if use_tqdm is None else use_tqdm
        params = self.get_default_sampling_params() if sampling_params is None else sampling_params
        if not isinstance(params, (SamplingParams, Iterable)):
            raise UserError("sampling_params must be a SamplingParams or a list of them, one per prompt")
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if not all(isinstance(p, SamplingParams) for p in per_prompt):
            raise UserError("sampling_params must be a SamplingParams or a list of them, one per prompt")
        if len(per_prompt) != len(prompts):
            raise UserError(f"{len(per_prompt)} sampling params for {len(prompts)} prompts: give one, or one "
                            f"per prompt")
        if not prompts:
            return []
        per_prompt = [self.prepare(p) for p in per_prompt]
        if stream is not None and (len(prompts) > 1 or per_prompt[0].n > 1 or not per_prompt[0].detokenize
                                   or self.tokenizer is None):
            raise UserError("streaming takes one prompt at a time, with n = 1, detokenize and a tokenizer (the "
                            "pieces are text)")
        ids = [self.encode(p) for p in prompts]
        ids = [self.truncated(i, p, sp.truncate_prompt_tokens) for i, p, sp in zip(ids, prompts, per_prompt)]
        per_prompt = [self.within_positions(len(i), p) for i, p in zip(ids, per_prompt)]
        runs = [(k, self.seeded(choice)) for k, p in enumerate(per_prompt) for choice in p.choices()]  # its n outputs
        sizes = [(len(ids[k]), p.max_tokens, p.prompt_logprobs is not None) for k, p in runs]
        outputs: list[RequestOutput | None] = [None] * len(runs)
        parts = self._parts_that_fit(sizes)
        # vLLM's bar over the prompts (with several; one prompt alone shows its prefill's bar)
        prompts_bar = tqdm(total=len(runs), desc="Processed prompts", unit="prompt", file=sys.stderr,
                           disable=not show_progress or len(runs) == 1)
        try:
            while parts:
                part = parts.pop(0)
                requests: list[Request] = []
                mates = Batchmates()
                batch = SequenceBatch()
                try:
                    for n, i in enumerate(part):
                        try:
                            requests.append(Request(self, ids[runs[i][0]], runs[i][1], stream, mates))
                        except GroupFull:
                            if not requests:
                                raise  # the group is full of other sequences
                            parts.insert(0, part[n:])  # the rest runs once these have ended
                            part = part[:n]
                            break
                    handles = [batch.add(r.run(show_progress and len(runs) == 1)) for r in requests]
                    prompts_bar.update(sum(h.done for h in handles))  # (ended as they were added: no step sees them)
                    while batch.active:
                        prompts_bar.update(len(batch.step()))
                    for i, request, handle in zip(part, requests, handles):
                        outputs[i] = request.output(*handle.result)
                finally:
                    for seq in batch.active:  # runs an error or an interrupt left midway: their prefix claims go
                        seq.run.close()
                    for request in requests:
                        request.close()
        finally:
            prompts_bar.close()
            requests = handles = batch = mates = None  # the last part's caches, freed before the trim
            release_freed()  # the requests' caches, back to the system (a batch job calls this for hours)
        runs_of: list[list[RequestOutput]] = [[] for _ in prompts]
        for (k, _), output in zip(runs, outputs):
            runs_of[k].append(output)
        return [self._request_output(prompt, choices) for prompt, choices in zip(prompts, runs_of)]

    def seeded(self, params: SamplingParams) -> SamplingParams:
        """A request without a seed seeded from the LLM's seed, where it has one (vLLM's LLM(seed=...))."""
        if params.seed is not None or self._seeds is None:
            return params
        return replace(params, seed=self._seeds.randrange(2**63))

    def _request_output(self, prompt, choices: list[RequestOutput]) -> RequestOutput:
        """One prompt's RequestOutput, from the runs of its n outputs (request ids count up, as vLLM's)."""
        return RequestOutput(str(next(self._request_ids)), prompt if isinstance(prompt, str) else None,
                             choices[0].prompt_token_ids, choices[0].prompt_logprobs,
                             [replace(c.outputs[0], index=i) for i, c in enumerate(choices)],
                             num_cached_tokens=choices[0].num_cached_tokens)


def _unwrapped(prompt):
    """vLLM's TextPrompt or TokensPrompt ({"prompt": text}, {"prompt_token_ids": ids}) as the text or the ids."""
    if not isinstance(prompt, dict):
        return prompt
    if len(prompt) != 1 or not {"prompt", "prompt_token_ids"} & set(prompt):
        raise UserError(f"a prompt dict takes one of 'prompt' (text) or 'prompt_token_ids' (got keys "
                        f"{', '.join(map(repr, prompt)) or 'none'})")
    return next(iter(prompt.values()))
