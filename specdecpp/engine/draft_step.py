"""The draft step every engine takes (`DraftStep`, `proposed_step`), the interfaces the loop steps models through
(`Draft`, `Target`) and the eager engine's models (`CachedModel`, `EagerDraft`)."""
from __future__ import annotations

import math
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from specdecpp.compat import cache_kwargs, move_cache_positions, takes_logits_to_keep
from specdecpp.engine.processing import Processing
from specdecpp.engine.sampling import DraftStep, draft_noise, proposed_token, widened
from specdecpp.head.model import LeanJudge


def proposed_step(processing: Processing, tokens: list[int], logits: torch.Tensor, hidden: torch.Tensor | None,
                  num_drafted: int, generator: torch.Generator | None, judge: LeanJudge | None = None) -> DraftStep:
    """The `DraftStep` of a draft forward after `tokens` with raw `logits` `[vocab]` (processed with that prefix) and
    the state `hidden` a head reads, judged by `judge` when given; one host sync."""
    logits = widened(logits)
    processed = processing.logits(tokens, logits[None])[0]
    # A greedy step judged by a head of the state alone reads no probability (token_prob NaN).
    probs = processed.softmax(-1) if processing.do_sample or judge is None or judge.features else None
    noise = draft_noise(processed.shape[-1], processed.device, generator) if processing.do_sample else None
    token = proposed_token(processed, probs, noise)
    values = [token.double()] + ([probs[token].double()] if probs is not None else [])
    if judge is not None:
        values.append(judge(hidden, logits, token, None if processing.changes_logits else probs).double())
    token, *read = torch.stack(values).tolist()
    return DraftStep(num_drafted, read[0] if probs is not None else math.nan, hidden, int(token), logits, probs,
                     warped=processing.changes_logits, accept_prob=read[-1] if judge is not None else None)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean visibility (True: seen) as an additive attention mask of `dtype`."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, torch.finfo(dtype).min)


class Draft(Protocol):
    """A draft as the loop steps it: eager (`EagerDraft`) or compiled (`CompiledDraft`, `ProcessedDraft`)."""

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

    scored = None  # a tree draft's children as its last forward's graph picked and scored them (compiled: TreeModel)

    def __init__(self, model: PreTrainedModel):
        self.model, self.device, self.cache = model, model.device, DynamicCache(config=model.config)
        self.cache.activate_past_recording()  # else sliding-window layers drop states a rollback needs
        self.logits_kwarg = "logits_to_keep" if takes_logits_to_keep(model) else None
        # Stepped as its base model then its output layer (its forward unwrapped, the last hidden state at hand) once
        # the first forward has shown that they give its logits and `hidden_states[-1]`: None until then, False if not.
        self.base_model, self.output_layer = model.base_model, model.get_output_embeddings()
        self.split = None if self.base_model is not model and self.output_layer is not None else False

    @property
    def length(self) -> int:
        """How many tokens the cache holds."""
        return self.cache.get_seq_length()

    def logits(self, seq: list[int], num_logits: int) -> torch.Tensor:
        return self.forward(seq, num_logits)[0]

    def forward(self, seq: list[int], num_logits: int,
                with_hidden_states: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits `[num_logits, vocab]` of the last `num_logits` of `seq` and (or None) the last hidden state."""
        seen = self.length
        logits, hidden = self.run(seq[seen:], list(range(seen, len(seq))), None, num_logits, with_hidden_states)
        return logits, hidden[-1] if hidden is not None else None

    def run(self, tokens: list[int], positions: list[int], visible: torch.Tensor | None, num_logits: int,
            with_hidden_states: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed `tokens` at `positions` after the cache (`visible`: `[tokens, cached + tokens]`, True where a token
        sees a key; None: causal); the logits `[num_logits, vocab]` of the last `num_logits` and (or None) the last
        hidden states there."""
        # Explicit positions: models that number new tokens from the cache's own bookkeeping can miscount.
        kwargs = {"input_ids": torch.tensor([tokens], device=self.device), **cache_kwargs(self.model, self.cache),
                  "position_ids": torch.tensor([positions], device=self.device)}
        if visible is not None:
            kwargs["attention_mask"] = additive_mask(visible.to(self.device), self.model.dtype)[None, None]
        if self.split:
            hidden = self.base_model(**kwargs).last_hidden_state[:, -num_logits:]
            return self.output_layer(hidden)[0], hidden[0]
        if self.logits_kwarg:
            kwargs[self.logits_kwarg] = num_logits
        if self.split is False:
            out = self.model(**kwargs, output_hidden_states=with_hidden_states)
            return out.logits[0, -num_logits:], out.hidden_states[-1][0, -num_logits:] if with_hidden_states else None
        captured = []
        handle = self.base_model.register_forward_hook(lambda module, args, out: captured.append(out))
        try:
            out = self.model(**kwargs, output_hidden_states=True)
        finally:
            handle.remove()
        logits, hidden = out.logits[:, -num_logits:], out.hidden_states[-1][:, -num_logits:]
        base_hidden = getattr(captured[0], "last_hidden_state", None) if captured else None
        self.split = base_hidden is not None and torch.equal(base_hidden[:, -num_logits:], hidden) \
            and torch.equal(self.output_layer(hidden), logits)
        return logits[0], hidden[0]

    def keep(self, start: int, sources: list[int], length: int) -> None:
        """Move the cache's positions `sources` to `start, start + 1, ...`, then keep its first `length`."""
        move_cache_positions(self.cache, start, sources)
        self.crop(length)

    def crop(self, length: int) -> None:
        if (extra := self.cache.get_seq_length() - length) > 0:
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
