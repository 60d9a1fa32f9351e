"""The draft step: what every engine computes after a draft forward, and the eager engine's forwards.

A draft step is one draft forward after the tokens so far and what follows from its logits
(`proposed_step`): the logits processed with that prefix, the token proposed (the argmax, greedy,
or a sample of their softmax) and the `DraftStep` the schedule judges, with the hidden state a head
reads. The engines differ only in how the forward runs: eagerly on a `DynamicCache` (here:
`CachedModel`, which also runs the target's verification, and `EagerDraft`), as one compiled graph
on a static cache (`specdecpp.engine.compiled`), or batched over several requests' caches
(`draft_steps`, the vLLM proposer's shape: a batch of rows, each stopping on its own). The head's
features and judgement are the head's own (`specdecpp.head.model`), called by the schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from specdecpp.compat import cache_kwargs, special_layers, takes_logits_to_keep
from specdecpp.engine.processing import Processing
from specdecpp.engine.sampling import draft_noise, proposed_token, widened


@dataclass
class DraftStep:
    """What the loop knows right after drafting token `y_j` (`num_drafted = j`): the token, the
    draft's probability of it and the distribution `probs` `[vocab]` it was drawn from (after any
    sampling warpers; `warped` says whether they changed it), the draft's raw logits `[vocab]` that
    proposed it (float32 or wider), and the draft's last-layer hidden state at the input position
    of that forward — the state of `y_{j-1}`, or of the last verified token when `j == 1` (only
    computed when the schedule asks for hidden states). `accept_prob` is the head's judgement when
    the step already made it (the compiled engine judges inside its draft graph), else None."""

    num_drafted: int
    token_prob: float
    hidden: torch.Tensor | None = None
    token: int = -1
    logits: torch.Tensor | None = None
    probs: torch.Tensor | None = None
    warped: bool = False
    accept_prob: float | None = None

    @property
    def raw_probs(self) -> torch.Tensor | None:
        """The softmax of the raw logits when the step computed it (unwarped), else None."""
        return None if self.warped else self.probs


def proposed_step(processing: Processing, tokens: list[int], logits: torch.Tensor, hidden: torch.Tensor | None,
                  num_drafted: int, generator: torch.Generator | None) -> DraftStep:
    """The `DraftStep` of a draft forward after `tokens` whose raw logits are `logits` `[vocab]`:
    the logits processed with that prefix, the token proposed from them (the argmax, greedy, or a
    sample of their softmax) and the hidden state `hidden` a head reads. The softmax is computed
    once and serves the choice, the acceptance test and (when nothing processed the logits) the
    head's features; the judgement is left to the schedule."""
    logits = widened(logits)
    processed = processing.logits(tokens, logits[None])[0]
    probs = processed.softmax(-1)
    noise = draft_noise(probs.shape[-1], probs.device, generator) if processing.do_sample else None
    token = int(proposed_token(processed, probs, noise))
    return DraftStep(num_drafted, float(probs[token]), hidden, token, logits, probs, warped=processing.changes_logits)


class CachedModel:
    """A causal LM and its KV cache. `forward(seq)` feeds only the tokens of `seq` the cache has
    not seen, so nothing is recomputed; `crop(n)` forgets everything past the first `n` tokens."""

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

    def forward(self, seq: list[int], num_logits: int,
                with_hidden_states: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits `[num_logits, vocab]` for the last `num_logits` positions of `seq`, and (if
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
        """Forget everything past the first `length` tokens."""
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)  # transformers 5: a negative count removes that many positions


class EagerDraft(CachedModel):
    """The draft as the eager loop runs it: a `CachedModel` whose `draft_step` proposes one token
    under `processing` and returns the hidden state when `with_hidden_states` (a schedule that reads it)."""

    def __init__(self, model: PreTrainedModel, processing: Processing, with_hidden_states: bool = False):
        super().__init__(model)
        self.processing, self.with_hidden_states = processing, with_hidden_states

    def draft_step(self, tokens: list[int], num_drafted: int, generator: torch.Generator | None) -> DraftStep:
        """One draft forward after `tokens` and the token it proposes (`proposed_step`)."""
        logits, state = self.forward(tokens, num_logits=1, with_hidden_states=self.with_hidden_states)
        return proposed_step(self.processing, tokens, logits[0], state, num_drafted, generator)

    def steps_together(self, tokens: list[int]) -> bool:
        """Whether this draft's next step can join a batched one (`draft_steps`): its cache holds
        all of `tokens` but the last, in plain full-attention layers, and the state a head reads
        is its output layer's input (checked on an earlier step)."""
        return (self.cache.get_seq_length() == len(tokens) - 1
                and not special_layers(self.cache)
                and (not self.with_hidden_states or self.output_input_is_hidden is True))


def draft_steps(drafts: list[EagerDraft], seqs: list[list[int]], num_drafted: int,
                generator: torch.Generator | None = None) -> list[DraftStep]:
    """One draft step for several requests of one draft model (a vLLM batch), each after its own
    tokens `seqs[i]`: one forward over their last tokens with their caches padded on the left to one
    length, then each request's new keys and values appended to its own cache and its token proposed
    as `EagerDraft.draft_step` proposes it (`proposed_step`). Drafts that cannot join
    (`EagerDraft.steps_together`) step alone."""
    together = [i for i, (draft, seq) in enumerate(zip(drafts, seqs)) if draft.steps_together(seq)]
    steps = {i: drafts[i].draft_step(seqs[i], num_drafted, generator) for i in range(len(drafts)) if i not in together}
    if len(together) == 1:
        steps[together[0]] = drafts[together[0]].draft_step(seqs[together[0]], num_drafted, generator)
    elif together:
        logits, states = _forward_together([drafts[i] for i in together], [seqs[i] for i in together])
        for row, i in enumerate(together):
            state = states[row] if drafts[i].with_hidden_states else None
            steps[i] = proposed_step(drafts[i].processing, seqs[i], logits[row], state, num_drafted, generator)
    return [steps[i] for i in range(len(drafts))]


def _forward_together(drafts: list[EagerDraft], seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's forward over each request's last token, batched: logits `[n, vocab]` and the
    output layer's inputs `[n, hidden]`, each request's cache extended by its new position."""
    model, device = drafts[0].model, drafts[0].device
    lengths = [len(seq) - 1 for seq in seqs]
    longest = max(lengths)
    batch = DynamicCache(config=model.config)
    for layer in range(len(drafts[0].cache.layers)):
        keys, values = ([torch.nn.functional.pad(getattr(d.cache.layers[layer], part), (0, 0, longest - n, 0))
                         for d, n in zip(drafts, lengths)] for part in ("keys", "values"))
        batch.update(torch.cat(keys), torch.cat(values), layer)
    mask = torch.arange(longest + 1, device=device)[None] >= torch.tensor(
        [longest - n for n in lengths], device=device)[:, None]
    captured = []
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    try:
        out = model(input_ids=torch.tensor([seq[-1:] for seq in seqs], device=device), attention_mask=mask.long(),
                    position_ids=torch.tensor([[n] for n in lengths], device=device), logits_to_keep=1,
                    **cache_kwargs(model, batch))
    finally:
        handle.remove()
    for layer in range(len(batch.layers)):
        new_keys, new_values = batch.layers[layer].keys[:, :, -1:], batch.layers[layer].values[:, :, -1:]
        for row, draft in enumerate(drafts):
            draft.cache.update(new_keys[row:row + 1], new_values[row:row + 1], layer)
    return out.logits[:, -1], captured[-1][:, -1]
