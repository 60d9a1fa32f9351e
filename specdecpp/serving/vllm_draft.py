"""vLLM's `draft_model` proposer with the head deciding each request's length (docs/design.md, Serving)."""
from __future__ import annotations

import time

import torch
from vllm.v1.spec_decode.draft_model import DraftModelProposer

from specdecpp.engine.schedules import make_schedule
from specdecpp.engine.settings import DecodingSettings
from specdecpp.serving.vllm import BatchRound, ServedCosts, StopDrafting, VllmPrices


class SpecDecPPDraftProposer(DraftModelProposer):
    """vLLM's `DraftModelProposer`, its loop unchanged, each step also judged by the head (`BatchRound`)."""

    settings: DecodingSettings
    new_round = BatchRound  # what judges a propose (vllm_timing swaps in its timed rounds)
    WRAPS = ("__init__", "propose", "_sample_draft_tokens", "_sample_from_logits", "take_last_draft_probs")

    @classmethod
    def plug(cls, proposer: DraftModelProposer, settings: DecodingSettings, prices: VllmPrices | None) -> None:
        """Make the `DraftModelProposer` vLLM just built one of these, stopping on `settings`, a batch at `prices`."""
        proposer.__class__ = cls
        proposer.settings, proposer.prices = settings, prices
        settings.head.to(proposer.device)
        proposer.schedules = []  # one ada schedule per batch row, reused from round to round
        proposer.round, proposer.served = None, ServedCosts()
        proposer.proposed_tokens, proposer.draft_steps, proposer.expected_accepted = 0, 0, 0.0

    def propose(self, num_speculative_tokens: int, *args, **kwargs) -> list[list[int]]:
        """Each request's tokens from up to `min(num_speculative_tokens, bound[1])` draft steps."""
        self.round = self.new_round(self.settings.head, self.schedules,
                                    min(num_speculative_tokens, self.settings.bound[1]), self.prices, self.served)
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
        return proposals

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        """vLLM's sampling of a draft step, then the head's judgement."""
        while len(self.schedules) < hidden_states.shape[0]:
            self.schedules.append(make_schedule(self.settings))
        logits = self.model.compute_logits(hidden_states)
        tokens, probs = self._sample_from_logits(logits, sampling_metadata)
        self.round.step(hidden_states, logits, tokens, probs)
        return tokens, probs

