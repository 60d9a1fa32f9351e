"""vLLM's `draft_model` proposer with the head deciding each request's length (docs/design.md, Serving)."""
from __future__ import annotations

import time

import torch
from vllm.v1.spec_decode.draft_model import DraftModelProposer

from specdecpp.engine.schedules import make_schedule
from specdecpp.engine.settings import DecodingSettings
from specdecpp.head.model import LeanJudge
from specdecpp.serving.vllm import BatchRound, ServedAcceptance, ServedCosts, StopDrafting, VllmPrices


class SpecDecPPDraftProposer(DraftModelProposer):
    """vLLM's `DraftModelProposer`, its loop unchanged, each step also judged by the head (`BatchRound`)."""

    settings: DecodingSettings
    new_round = BatchRound  # what judges a propose (vllm_timing swaps in its timed rounds)
    WRAPS = ("__init__", "propose", "_sample_draft_tokens", "_sample_from_logits", "take_last_draft_probs")

    @classmethod
    def plug(cls, proposer: DraftModelProposer, settings: DecodingSettings, prices: VllmPrices | None,
             runner=None) -> None:
        """Make the `DraftModelProposer` vLLM just built for `runner` one of these, stopping on `settings`, a batch
        at `prices` with the survival its verifications show (none read without a runner)."""
        proposer.__class__ = cls
        proposer.settings, proposer.prices, proposer.runner = settings, prices, runner
        settings.head.to(proposer.device)
        proposer.judge = LeanJudge(settings.head, proposer.device)
        proposer.schedules = []  # one ada schedule per batch row, reused from round to round
        proposer.round, proposer.served, proposer.acceptance = None, ServedCosts(), ServedAcceptance()
        proposer.proposed_tokens, proposer.draft_steps, proposer.expected_accepted = 0, 0, 0.0

    def propose(self, num_speculative_tokens: int, *args, **kwargs) -> list[list[int]]:
        """Each request's tokens from up to `min(num_speculative_tokens, bound[1])` draft steps."""
        emitted = self.read_verification(kwargs.get("common_attn_metadata"), kwargs.get("num_rejected_tokens_gpu"))
        self.round = self.new_round(self.judge, self.schedules, min(num_speculative_tokens,
                                    self.settings.bound[1]), self.prices, self.served, self.acceptance,
                                    self.rooms(emitted))
        try:
            drafted = super().propose(num_speculative_tokens, *args, **kwargs)
            if not self.round.tokens:  # nothing to draft (K = 0)
                self.served.observe(self.round, time.perf_counter())
                return [[] for _ in range(drafted.shape[0])]
        except StopDrafting:
            pass
        self._last_draft_probs = self.round.draft_probs()
        proposals = self.round.proposals()
        self.proposed_tokens += sum(map(len, proposals))
        self.draft_steps += len(self.round.tokens)
        self.expected_accepted += sum(sum(survival[:len(p)]) for survival, p in zip(self.round.survival, proposals))
        self.served.observe(self.round, time.perf_counter())
        if self.runner is not None:
            self.acceptance.proposed(self.runner.input_batch.req_ids[:len(proposals)],
                                     [survival[:len(p)] for survival, p in zip(self.round.survival, proposals)])
        return proposals

    def read_verification(self, metadata, rejected: torch.Tensor | None) -> list[int] | None:
        """Hand `acceptance` what vLLM verified of the last proposals: per request, its query (its drafted tokens
        and one) and its `rejected` tokens (None: nothing drafted was verified). Returns per request the tokens
        this step adds to its output (None: unread)."""
        if self.runner is None or metadata is None or rejected is None:
            self.acceptance.forget()
            return None
        rows = metadata.num_reqs
        drafted = (metadata.query_start_loc_cpu[1:rows + 1] - metadata.query_start_loc_cpu[:rows] - 1).tolist()
        rejected = rejected[:rows].tolist()
        self.acceptance.verified(self.runner.input_batch.req_ids[:rows], drafted, rejected)
        states = [self.runner.requests.get(request) for request in self.runner.input_batch.req_ids[:rows]]
        # A request's first output token comes from its prefill, whose query is its prompt.
        return [1 if state is None or not state.output_token_ids else n - k + 1
                for state, n, k in zip(states, drafted, rejected)]

    def rooms(self, emitted: list[int] | None) -> list[int] | None:
        """Per request, the most tokens worth proposing after this step's `emitted` ones: one fewer than its
        `max_tokens` leaves, since a verification adds a token of its own (None: unknown)."""
        if emitted is None:
            return None
        states = [self.runner.requests.get(request) for request in self.runner.input_batch.req_ids[:len(emitted)]]
        return [self.settings.bound[1] if state is None or state.sampling_params is None
                or state.sampling_params.max_tokens is None
                else max(0, state.sampling_params.max_tokens - len(state.output_token_ids) - new - 1)
                for state, new in zip(states, emitted)]

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        """vLLM's sampling of a draft step, then the head's judgement."""
        while len(self.schedules) < hidden_states.shape[0]:
            self.schedules.append(make_schedule(self.settings))
        logits = self.model.compute_logits(hidden_states)
        tokens, probs = self._sample_from_logits(logits, sampling_metadata)
        self.round.step(hidden_states, logits, tokens, probs)
        return tokens, probs

