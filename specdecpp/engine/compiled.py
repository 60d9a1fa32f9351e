"""The compiled engine (`speculative_generate(..., compile=True)`): static KV caches and steps
that each run as one `torch.compile`d graph.

In the eager loop a small draft's step costs far more than its arithmetic: Python and kernel
launches for hundreds of small operations. Here both models keep a `StaticCache` of fixed size and
each step is one graph (docs/design.md, The compiled engine):

- the draft step: the forward of the 1 or 2 tokens the draft has not seen, the logits processing,
  the choice of token (greedy: the argmax; sampling: the argmax of `probs / E` with `E ~ Exp(1)`,
  an exact sample, its noise drawn outside the graph from the user's generator), the draft's
  probability of that token and, for `ada`, the head's judgement (features included);
- the verification: the target's forward over `[last verified, y_1..y_k]`, one graph for one token
  (the target alone) and one whose length is dynamic for two and more, so that no round length
  compiles mid-generation and none is padded. The acceptance test is the eager loop's.

Rollback is a crop that moves the cache's length counter (transformers >= 5.24). Tokens beyond
what a graph takes (the prompt; a draft that sat out rounds) are fed eagerly first. Graphs are
compiled once per model, draft settings and cache capacity, per process, in a warm-up whose time
`GenerationStats.compile_time` reports; decoding then runs with recompilation forbidden.
"""
from __future__ import annotations

import contextlib
import copy
import time
import types
import weakref

import torch
from transformers import PreTrainedModel, StaticCache

from specdecpp.checks import vocab_size
from specdecpp.compat import (STATIC_CACHE_CROPS, TRANSFORMERS_VERSION, cache_kwargs, compile_guarded_state, is_sliding,
                              special_layers)
from specdecpp.engine.draft_step import DraftStep, proposed_step
from specdecpp.engine.processing import Processing
from specdecpp.engine.sampling import SAMPLING_WARPERS, draft_noise, make_warpers, proposed_token, widened
from specdecpp.engine.settings import HEAD_SCHEDULES, DecodingSettings
from specdecpp.head.model import AcceptancePredictionHead, logit_features

MIN_CAPACITY = 256  # cache capacities are powers of two from here, so few engines cover all prompts

# model -> {(role, settings..., capacity): its engine}; an engine lives as long as its model.
_engines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def recompiles_forbidden(enabled: bool = True):
    """A context in which a compiled graph that would recompile raises instead (decoding after the
    warm-up: a recompile there is a bug, and a silent one costs seconds); a no-op unless `enabled`."""
    return torch.compiler.set_stance("fail_on_recompile") if enabled else contextlib.nullcontext()


def compiled_models(target: PreTrainedModel, draft: PreTrainedModel | None, settings: DecodingSettings,
                    max_length: int, processing: Processing | None = None, with_hidden_states: bool = False
                    ) -> tuple[StaticModel, CompiledDraft | ProcessedDraft | None, float]:
    """The compiled engine's target and (unless `draft` is None) draft for `settings` (its
    sampling settings; the head of `ada` and `ada-budget`), with empty caches holding at least
    `max_length` tokens. Under `processing` beyond the sampling warpers the draft's graph applies
    (`sampling.SAMPLING_WARPERS`: a repetition penalty, ...) the draft is this generation's
    `ProcessedDraft` over a shared `DraftForward`, whose steps return the hidden states a head
    reads. Engines are built and warmed up on first use and reused after; returns them and the
    seconds this call spent compiling (0 when both were ready)."""
    target_model, seconds = _engine(target, ("target",), max_length, lambda capacity: StaticModel(target, capacity))
    if draft is None:
        return target_model, None, seconds
    if processing is not None and any(not isinstance(p, SAMPLING_WARPERS) for p in processing.processors):
        forward, draft_seconds = _engine(draft, ("processed draft", with_hidden_states), max_length,
                                         lambda capacity: DraftForward(draft, capacity, with_hidden_states))
        return target_model, ProcessedDraft(forward, processing), seconds + draft_seconds
    head = settings.head if settings.schedule in HEAD_SCHEDULES else None
    sampling = (settings.temperature, settings.top_k, settings.top_p) if settings.do_sample else None
    draft_model, draft_seconds = _engine(draft, ("draft", sampling, head_shape(head)), max_length,
                                         lambda capacity: CompiledDraft(draft, capacity, sampling, head))
    if head is not None:
        draft_model.load_head(head)
    return target_model, draft_model, seconds + draft_seconds


def head_shape(head: AcceptancePredictionHead | None) -> tuple | None:
    """What a compiled draft step's graph depends on in a head: its kind and its tensors' shapes and
    dtypes, not their values (heads of one shape share an engine, their weights copied in)."""
    if head is None:
        return None
    tensors = tuple((name, tuple(t.shape), t.dtype) for name, t in head.state_dict().items())
    return head.alignment, tuple(head.features), head.reads_hidden_states, tensors


def _engine(model: PreTrainedModel, key: tuple, max_length: int, build) -> tuple[StaticModel, float]:
    """The smallest engine for `model` and `key` holding `max_length` tokens, reset; else a new one
    built by `build(capacity)`. An engine is warmed up when built and again when state its graphs
    guard on has changed since (a model of a new class was built: they recompile here, not
    mid-generation). Returns it and the seconds spent compiling."""
    engines = _engines.setdefault(model, {})
    fitting = [capacity for (k, capacity) in engines if k == key and capacity >= max_length]
    start = time.perf_counter()
    if fitting:
        engine = engines[key, min(fitting)]
        engine.reset()
    else:
        capacity = max(MIN_CAPACITY, 1 << (max_length - 1).bit_length())
        engine = engines[key, capacity] = build(capacity)
    if engine.compiled_for == (state := compile_guarded_state()):
        return engine, 0.0
    if engine.compiled_for is not NotImplemented:
        # Graphs of their own, not a recompile: each change of the guarded state would otherwise
        # spend the graph's recompile budget (8), and a long process runs out of it.
        engine.build_graphs()
    engine.warm_up()
    engine.compiled_for = state
    return engine, time.perf_counter() - start


def uses_cuda_graphs(device: torch.device) -> bool:
    """Whether the engine's graphs on `device` run as CUDA graphs (launch overhead is what a small
    model's step pays on a GPU)."""
    return device.type == "cuda"


def _compile(method, dynamic: bool | None, cuda: bool):
    """`torch.compile` of a private copy of the bound `method`. Dynamo keeps compiled graphs per
    code object, so a copy per engine keeps each engine's graphs, guards and recompile budget apart
    from other models'."""
    function = method.__func__
    own = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                             function.__defaults__, function.__closure__)
    return torch.compile(types.MethodType(own, method.__self__), fullgraph=True, dynamic=dynamic,
                         mode="reduce-overhead" if cuda else None)


class StaticModel:
    """A causal LM on a `StaticCache` of `capacity` tokens, as the compiled engine steps it: the
    target's verification (`forward`, graphs for 1 and for 2+ tokens), `crop` and `reset`. The
    length the cache holds is tracked here, so no step reads it back from the device."""

    def __init__(self, model: PreTrainedModel, capacity: int):
        if not STATIC_CACHE_CROPS:
            raise ValueError(f"compile=True needs transformers >= 5.24, whose StaticCache crops by moving a counter "
                             f"(the engine's rollback); transformers {TRANSFORMERS_VERSION} is installed: "
                             "upgrade it or decode with compile=False")
        self.model, self.capacity, self.device = model, capacity, model.device
        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        _check_full_attention(self.cache, model)
        self.model_kwargs = cache_kwargs(model, self.cache)
        self.cuda_graphs = uses_cuda_graphs(self.device)
        self.length = 0
        self.compiled_for = NotImplemented  # the guarded state its graphs were warmed up for: none yet
        self._allocate()
        self.build_graphs()

    def _allocate(self) -> None:
        """Allocate the cache (its layers do so in their first forward) outside inference mode, so
        that its tensors are ordinary ones that `crop` may change in any mode."""
        with torch.no_grad():
            self._feed([0])
        self.reset()

    def build_graphs(self) -> None:
        """New compiled graphs for the steps (compiled on their first call)."""
        self.verify_graph = _compile(self._logits, dynamic=None, cuda=self.cuda_graphs)

    def forward(self, seq: list[int], num_logits: int, with_hidden_states: bool = False) -> tuple[torch.Tensor, None]:
        """Logits `[num_logits, vocab]` for the last `num_logits` positions of `seq` from the
        verification graph, after feeding eagerly the earlier tokens the cache has not seen.
        (`with_hidden_states` is the eager `CachedModel`'s; the compiled target never returns a state.)"""
        self._feed(seq[:-num_logits])
        logits = self._run(self.verify_graph, self._ids(seq[-num_logits:]))
        self.length = len(seq)
        return logits, None

    def crop(self, length: int) -> None:
        """Forget everything past the first `length` tokens (moves the cache's counter)."""
        if self.length > length:
            self.cache.crop(length - self.length)
            self.length = length

    def reset(self) -> None:
        """An empty cache, for a new generation (stale states past the length are never attended)."""
        self.crop(0)

    def warm_up(self) -> None:
        """Compile the verification graphs (1, 2 and 3 tokens: the third must reuse the dynamic
        graph), then reset."""
        with torch.inference_mode():
            self._feed([0])
            for length in (1, 2, 3):
                self.forward([0] * (1 + length), num_logits=length)
                self.crop(1)
        self.reset()

    def _logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, position_ids=self._positions(input_ids), **self.model_kwargs)
        return out.logits[0]

    def _positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Positions from the cache's own counter (a tensor), so the graph holds for every length.
        return self.cache.get_seq_length() + torch.arange(input_ids.shape[1], device=input_ids.device)[None]

    def _feed(self, tokens: list[int]) -> None:
        """Eager forward over the tokens of `tokens` the cache has not seen (a prompt, a catch-up).
        A cache that holds more than `tokens` is cropped to them first, so that the counter the
        graphs read and `length` never part."""
        self.crop(len(tokens))
        if len(tokens) > self.capacity:
            raise ValueError(f"the compiled engine's cache holds {self.capacity} tokens and this generation needs "
                             f"{len(tokens)}")
        if len(tokens) > self.length:
            self._logits(self._ids(tokens[self.length:]))
            self.length = len(tokens)

    def _new_ids(self, tokens: list[int]) -> torch.Tensor:
        """A draft step graph's input after `tokens`: the last one or two tokens the cache has not
        seen (the last verified token, and the one before it when the round accepted everything),
        earlier ones fed eagerly first."""
        new = tokens[-2:] if len(tokens) - self.length == 2 else tokens[-1:]
        self._feed(tokens[:-len(new)])
        return self._ids(new)

    def _ids(self, tokens: list[int]) -> torch.Tensor:
        if self.length + len(tokens) > self.capacity:
            raise ValueError(f"the compiled engine's cache holds {self.capacity} tokens and this generation needs "
                             f"{self.length + len(tokens)}")
        return torch.tensor([tokens], device=self.device)

    def _run(self, graph, *inputs):
        if not self.cuda_graphs:
            return graph(*inputs)
        # A CUDA graph's outputs live in its own memory pool, overwritten by its next replay.
        torch.compiler.cudagraph_mark_step_begin()
        out = graph(*inputs)
        return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()


class CompiledDraft(StaticModel):
    """The draft as the compiled engine steps it: `draft_step` runs one graph that proposes a
    token (greedy, or sampled with `sampling = (temperature, top_k, top_p)`) and, given an `ada`
    `head`, judges the step's state and the proposed token's features (`DraftStep.accept_prob`;
    which drafted token that judgement covers is the head's alignment, `schedules.Ada.stop_after`)."""

    def __init__(self, model: PreTrainedModel, capacity: int, sampling: tuple[float, int, float] | None,
                 head: AcceptancePredictionHead | None):
        super().__init__(model, capacity)
        self.warpers = make_warpers(*sampling) if sampling is not None else None
        # The engine's own copy, on the draft's device: the judgement runs inside the draft's graph.
        self.head = copy.deepcopy(head).to(self.device).eval() if head is not None else None
        # What the head reads of the proposed token (a reader head reads none: whose judgement a
        # step's is, is the schedule's rule, `schedules.Ada.stop_after`).
        self.features = head.features if head is not None else []
        self.reads_hidden = head is not None and head.reads_hidden_states
        if self.reads_hidden:
            _check_last_hidden_state(model)
        self.vocab = vocab_size(model)

    def build_graphs(self) -> None:
        """New compiled graphs: the verification's (unused: a draft catches up eagerly) and the draft step's."""
        super().build_graphs()
        self.step_graph = _compile(self._step, dynamic=False, cuda=self.cuda_graphs)

    def load_head(self, head: AcceptancePredictionHead) -> None:
        """Judge with `head`'s weights from now on (a head of the shape this engine was built for),
        copied in place, so that the compiled graph holds."""
        with torch.no_grad():
            for mine, theirs in zip(self.head.state_dict().values(), head.state_dict().values()):
                mine.copy_(theirs)

    def draft_step(self, tokens: list[int], num_drafted: int, generator: torch.Generator | None) -> DraftStep:
        """The draft's proposal after `tokens` (the `num_drafted`-th of its round): one graph over
        the last one or two tokens the cache has not seen, earlier ones fed eagerly first."""
        noise = None if self.warpers is None else draft_noise(self.vocab, self.device, generator)
        values, probs = self._run(self.step_graph, self._new_ids(tokens), noise)
        self.length = len(tokens)
        token, token_prob, *judged = values.tolist()
        return DraftStep(num_drafted, token_prob, token=int(token), probs=probs, warped=self.warpers is not None,
                         accept_prob=judged[0] if judged else None)

    def warm_up(self) -> None:
        """Compile the draft step for 1 and 2 new tokens, then reset."""
        generator = torch.Generator(self.device).manual_seed(0)  # the user's generator is not drawn from
        with torch.inference_mode():
            for tokens in ([0, 0], [0, 0, 0]):
                self._feed([0])
                self.draft_step(tokens, 1, generator)
                self.reset()

    def _step(self, input_ids: torch.Tensor, noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, position_ids=self._positions(input_ids), logits_to_keep=1,
                         output_hidden_states=self.reads_hidden, **self.model_kwargs)
        logits = widened(out.logits[0, -1])
        if self.warpers is None:
            probs = raw_probs = logits.softmax(-1)
            token = proposed_token(logits, probs, None)
        else:
            warped = self.warpers(None, logits[None])[0]
            probs, raw_probs = warped.softmax(-1), None
            token = proposed_token(warped, probs, noise)
        values = [token.double(), probs.gather(0, token[None])[0].double()]  # gather: indexing by a tensor breaks the graph
        if self.head is not None:  # the head's features and judgement, as the eager step's (`schedules.Ada.judge`)
            hidden = out.hidden_states[-1][0, -1] if self.reads_hidden else None
            features = logit_features(logits, token, self.features, raw_probs) if self.features else None
            values.append(self.head.accept_prob(hidden, features).double())
        return torch.stack(values), probs


class DraftForward(StaticModel):
    """The draft's forward alone as one graph, for drafts under logits processors that read the
    prefix (a repetition penalty, banned words, ...), which a fixed graph cannot apply: `step` gives
    the last position's raw logits and (`with_hidden_states`) the hidden state a head reads. Shared
    across generations; each generation drafts through its own `ProcessedDraft` over it."""

    def __init__(self, model: PreTrainedModel, capacity: int, with_hidden_states: bool):
        self.with_hidden_states = with_hidden_states
        super().__init__(model, capacity)
        if with_hidden_states:
            _check_last_hidden_state(model)

    def build_graphs(self) -> None:
        """New compiled graphs: the verification's (unused: a draft catches up eagerly) and the forward's."""
        super().build_graphs()
        self.step_graph = _compile(self._step, dynamic=False, cuda=self.cuda_graphs)

    def step(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The draft's raw logits `[vocab]` after `tokens`, and (`with_hidden_states`, else None) its
        hidden state there: one graph over the last one or two tokens the cache has not seen."""
        logits, state = self._run(self.step_graph, self._new_ids(tokens))
        self.length = len(tokens)
        return logits, state if self.with_hidden_states else None

    def warm_up(self) -> None:
        """Compile the forward for 1 and 2 new tokens, then reset."""
        with torch.inference_mode():
            for tokens in ([0, 0], [0, 0, 0]):
                self._feed([0])
                self.step(tokens)
                self.reset()

    def _step(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, position_ids=self._positions(input_ids), logits_to_keep=1,
                         output_hidden_states=self.with_hidden_states, **self.model_kwargs)
        state = out.hidden_states[-1][0, -1] if self.with_hidden_states else out.logits.new_zeros(())
        return out.logits[0, -1], state


class ProcessedDraft:
    """One generation's draft under logits processors that read the prefix: the shared `forward`
    engine (`DraftForward`) runs the forward as one graph; this generation's `processing` with the
    prefix, the choice of token and the head's judgement then run as in the eager draft
    (`draft_step.proposed_step`)."""

    def __init__(self, forward: DraftForward, processing: Processing):
        self.forward, self.processing = forward, processing

    def draft_step(self, tokens: list[int], num_drafted: int, generator: torch.Generator | None) -> DraftStep:
        """The draft's forward after `tokens` as one graph, then `draft_step.proposed_step`."""
        logits, state = self.forward.step(tokens)
        return proposed_step(self.processing, tokens, logits, state, num_drafted, generator)

    def crop(self, length: int) -> None:
        """Forget everything past the first `length` tokens."""
        self.forward.crop(length)


def _check_full_attention(cache: StaticCache, model: PreTrainedModel) -> None:
    """ValueError unless every layer of `cache` is a full-attention `StaticLayer`: a sliding-window
    layer keeps its length as a Python int (every step would recompile), and other layers do not crop."""
    if layers := special_layers(cache):
        kind = "a sliding-window layer" if is_sliding(layers[0]) else "a layer"
        raise ValueError(f"compile=True: {model.config.model_type} gets {kind} ({type(layers[0]).__name__}) in its "
                         "static cache, and the compiled engine supports full-attention StaticLayer caches only "
                         "(rolled back by moving a counter the graph reads); decode it with compile=False")


def _check_last_hidden_state(model: PreTrainedModel) -> None:
    """ValueError unless the draft's last `output_hidden_states` entry is its output layer's input,
    the state the head was trained on (the eager engine reads that input with a hook instead)."""
    output_layer = model.get_output_embeddings()
    captured = []
    handle = output_layer.register_forward_pre_hook(lambda module, args: captured.append(args[0])) \
        if output_layer is not None else None
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=model.device),
                        output_hidden_states=True, use_cache=False)
    finally:
        if handle is not None:
            handle.remove()
    if not captured or not torch.equal(captured[-1][0, -1], out.hidden_states[-1][0, -1]):
        raise ValueError(f"compile=True with a head that reads hidden states: this {model.config.model_type} draft's "
                         "last hidden state is not its output layer's input (the state the head reads); decode it "
                         "with compile=False")
