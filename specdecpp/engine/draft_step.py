"""The draft step every engine takes (`DraftStep`, `proposed_step`), the interfaces the loop steps
models through (`Draft`, `Target`) and the eager engine's models (`CachedModel`, `EagerDraft`).
"""
from __future__ import annotations

from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from specdecpp.compat import cache_kwargs, takes_logits_to_keep
from specdecpp.engine.processing import Processing
from specdecpp.engine.sampling import DraftStep, draft_noise, proposed_token, widened
from specdecpp.head.model import LeanJudge


def proposed_step(processing: Processing, tokens: list[int], logits: torch.Tensor, hidden: torch.Tensor | None,
                  num_drafted: int, generator: torch.Generator | None, judge: LeanJudge | None = None) -> DraftStep:
    """The `DraftStep` of a draft forward after `tokens` with raw `logits` `[vocab]`: processed with
    that prefix, the token chosen (`sampling.proposed_token`), the state `hidden` a head reads and,
    given `judge`, its P(accept); one host sync."""
    logits = widened(logits)
    processed = processing.logits(tokens, logits[None])[0]
    probs = processed.softmax(-1)
    noise = draft_noise(probs.shape[-1], probs.device, generator) if processing.do_sample else None
    token = proposed_token(processed, probs, noise)
    values = [token.double(), probs[token].double()]
    if judge is not None:
        values.append(judge(hidden, logits, token, None if processing.changes_logits else probs).double())
    token, token_prob, *judged = torch.stack(values).tolist()
    return DraftStep(num_drafted, token_prob, hidden, int(token), logits, probs, warped=processing.changes_logits,
                     accept_prob=judged[0] if judged else None)


class Draft(Protocol):
    """A draft as the loop steps it: eager (`EagerDraft`) or compiled (`compiled.CompiledDraft`,
    `compiled.ProcessedDraft`)."""

    def draft_step(self, tokens: list[int], num_drafted: int, generator: torch.Generator | None) -> DraftStep:
        """The draft's proposal after `tokens`, the `num_drafted`-th of its round."""

    def crop(self, length: int) -> None:
        """Forget everything past the first `length` tokens."""


class Target(Protocol):
    """A target as the loop verifies with it: eager (`CachedModel`) or compiled (`compiled.StaticModel`)."""

    def logits(self, seq: list[int], num_logits: int) -> torch.Tensor:
        """Logits `[num_logits, vocab]` for the last `num_logits` positions of `seq`."""

    def crop(self, length: int) -> None:
        """Forget everything past the first `length` tokens."""


class CachedModel:
    """A causal LM on a `DynamicCache`, fed only the tokens its cache has not seen."""

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.device = model.device
        self.cache = DynamicCache(config=model.config)
        # Sliding-window layers drop old states unless told that we may roll back.
        self.cache.activate_past_recording()
        self.logits_kwarg = "logits_to_keep" if takes_logits_to_keep(model) else None
        # The last hidden state is read as the output layer's input (nothing else is kept); None until
        # checked against `output_hidden_states` on a one-token step, False if they differ.
        self.output_layer = model.get_output_embeddings()
        self.output_input_is_hidden = None if self.output_layer is not None else False

    def logits(self, seq: list[int], num_logits: int) -> torch.Tensor:
        return self.forward(seq, num_logits)[0]

    def forward(self, seq: list[int], num_logits: int,
                with_hidden_states: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits `[num_logits, vocab]` for the last `num_logits` positions of `seq` and (if
        `with_hidden_states`) the last layer's hidden state at the last position."""
        seen = self.cache.get_seq_length()
        new_tokens = torch.tensor([seq[seen:]], device=self.device)
        # Explicit positions: models that number new tokens from the cache's own bookkeeping can miscount.
        kwargs = {"position_ids": torch.arange(seen, len(seq), device=self.device)[None]}
        if self.logits_kwarg:
            kwargs[self.logits_kwarg] = num_logits
        if not with_hidden_states:
            out = self.model(input_ids=new_tokens, **cache_kwargs(self.model, self.cache), **kwargs)
            return out.logits[0, -num_logits:], None
        check = self.output_input_is_hidden is None and new_tokens.shape[1] == 1
        all_layers = check or self.output_input_is_hidden is False
        captured = []
        handle = self.output_layer.register_forward_pre_hook(lambda module, args: captured.append(args[0])) \
            if self.output_layer is not None else None
        try:
            out = self.model(input_ids=new_tokens, **cache_kwargs(self.model, self.cache),
                             output_hidden_states=all_layers, **kwargs)
        finally:
            if handle is not None:
                handle.remove()
        if check:
            self.output_input_is_hidden = bool(torch.equal(captured[-1][0, -1], out.hidden_states[-1][0, -1]))
        state = out.hidden_states[-1][0, -1] if all_layers else captured[-1][0, -1]
        return out.logits[0, -num_logits:], state

    def crop(self, length: int) -> None:
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)  # transformers 5: a negative count removes that many positions


class EagerDraft(CachedModel):
    """The eager draft: a `CachedModel` proposing under `processing`, each step judged by `judge` when given."""

    def __init__(self, model: PreTrainedModel, processing: Processing, judge: LeanJudge | None = None):
        super().__init__(model)
        self.processing, self.judge = processing, judge
        self.with_hidden_states = judge is not None and judge.reads_hidden_states

    def draft_step(self, tokens: list[int], num_drafted: int, generator: torch.Generator | None) -> DraftStep:
        logits, state = self.forward(tokens, num_logits=1, with_hidden_states=self.with_hidden_states)
        return proposed_step(self.processing, tokens, logits[0], state, num_drafted, generator, self.judge)
