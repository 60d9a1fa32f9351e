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
        # What its rounds proposed, drafted, expected vLLM to accept and cost at its prices, added up.
        proposer.proposed_tokens, proposer.draft_steps, proposer.expected_accepted, proposer.priced_ms = 0, 0, 0.0, 0.0

    def propose(self, num_speculative_tokens: int, *args, **kwargs) -> list[list[int]]:
        """Each request's tokens from up to `min(num_speculative_tokens, bound[1])` draft steps."""
        rooms = self.read_verification(kwargs.get("common_attn_metadata"), kwargs.get("num_rejected_tokens_gpu"))
        self.round = self.new_round(self.judge, self.schedules, min(num_speculative_tokens, self.settings.bound[1]),
                                    self.prices, self.served, self.acceptance, rooms)
        try:
            drafted = super().propose(num_speculative_tokens, *args, **kwargs)
            if not self.round.tokens:  # nothing to draft (K = 0)
                self.priced_ms += self.served.observe(self.round, time.perf_counter())
                return [[] for _ in range(drafted.shape[0])]
        except StopDrafting:
            pass
        self._last_draft_probs = self.round.draft_probs()
        proposals = self.round.proposals()
        self.proposed_tokens += self.round.proposed_tokens()
        self.draft_steps += len(self.round.tokens)
        self.expected_accepted += sum(map(sum, self.round.survival))
        self.priced_ms += self.served.observe(self.round, time.perf_counter())
        if self.runner is not None:
            self.acceptance.proposed(self.runner.input_batch.req_ids[:len(proposals)], self.round.survival)
        return proposals

    def read_verification(self, metadata, rejected: torch.Tensor | None) -> list[int] | None:
        """Hand `acceptance` what vLLM verified of the last proposals: per request, its query (its drafted tokens
        and one) and its `rejected` tokens (None: nothing drafted was verified). Returns per request its room: the
        most tokens worth proposing once this step's are added, one fewer than its `max_tokens` leaves, since a
        verification adds a token of its own (None: unknown)."""
        if self.runner is None or metadata is None or rejected is None:
            self.acceptance.forget()
            return None
        rows, requests = metadata.num_reqs, self.runner.requests
        starts = metadata.query_start_loc_cpu[:rows + 1].tolist()
        drafted = [end - start - 1 for start, end in zip(starts, starts[1:])]
        rejected, ids = rejected[:rows].tolist(), self.runner.input_batch.req_ids[:rows]
        self.acceptance.verified(ids, drafted, rejected)
        rooms = []
        for request, n, k in zip(ids, drafted, rejected):
            state = requests.get(request)
            if state is None or state.sampling_params is None or state.sampling_params.max_tokens is None:
                rooms.append(self.settings.bound[1])
                continue
            # A request's first output token comes from its prefill, whose query is its prompt.
            made = len(state.output_token_ids)
            rooms.append(max(0, state.sampling_params.max_tokens - made - (n - k + 1 if made else 1) - 1))
        return rooms

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        """vLLM's sampling of a draft step, then the head's judgement."""
        while len(self.schedules) < hidden_states.shape[0]:
            self.schedules.append(make_schedule(self.settings))
        logits = self.model.compute_logits(hidden_states)
        tokens, probs = self._sample_from_logits(logits, sampling_metadata)
        self.round.step(hidden_states, logits, tokens, probs)
        return tokens, probs

