"""The compiled engine (`compile=True`, docs/design.md): both models on a `StaticCache`, each step one `torch.compile`d
graph, compiled once per model, draft settings and capacity in a warm-up; decoding then forbids recompiling."""
from __future__ import annotations

import contextlib
import time
import types
import weakref
from collections.abc import Callable

import torch
from transformers import PreTrainedModel, StaticCache

from specdecpp.checks import vocab_size
from specdecpp.compat import (COMPILE_GUARD_FILTER, STATIC_CACHE_CROPS, TRANSFORMERS_VERSION, cache_kwargs,
                              compile_guarded_state, copy_static_cache, is_sliding, special_layers)
from specdecpp.engine.draft_step import CachedModel, additive_mask, proposed_step
from specdecpp.engine.processing import Processing
from specdecpp.engine.schedules import MAX_TREE_NODES, children_scores
from specdecpp.engine.sampling import SAMPLING_WARPERS, DraftStep, draft_noise, make_warpers, proposed_token, widened
from specdecpp.head.model import AcceptancePredictionHead, LeanJudge

MIN_CAPACITY = 256  # cache capacities are powers of two from here, so few engines cover all prompts
# Row counts a token tree's forwards pad to: each power of two (a level) and one more (that many nodes and the root).
TREE_ROWS = tuple(sorted({rows for i in range(1, MAX_TREE_NODES.bit_length()) for rows in (1 << i, (1 << i) + 1)}))


def capacity_for(max_length: int) -> int:
    """The cache capacity of the engine a generation of `max_length` tokens runs on: attention reads all of it."""
    return max(MIN_CAPACITY, 1 << (max_length - 1).bit_length())


def longest_per_capacity(items: list, max_length: Callable) -> list:
    """The longest of `items` by `max_length(item)` per engine capacity: a warm-up on them leaves none to compile."""
    return list({capacity_for(max_length(item)): item for item in sorted(items, key=max_length)}.values())


# model -> {(role, settings..., capacity): its engine}; an engine lives as long as its model.
_engines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def clear_engines() -> None:
    """Drop every compiled engine (after a model's modules or config changed: the graphs do not check them)."""
    _engines.clear()


def recompiles_forbidden(enabled: bool = True):
    """A context in which a graph that would recompile raises instead (a no-op unless `enabled`)."""
    return torch.compiler.set_stance("fail_on_recompile") if enabled else contextlib.nullcontext()


def compiled_models(target: PreTrainedModel, draft: PreTrainedModel | None, max_length: int, processing: Processing,
                    head: AcceptancePredictionHead | None = None,
                    sampling: tuple[float, int, float] | None = None, longest_verification: int = 3
                    ) -> tuple[StaticModel, CompiledDraft | ProcessedDraft | None, float]:
    """The compiled target and (unless None) draft, empty, for at least `max_length` tokens, the draft judging with
    `head` and sampling with `(temperature, top_k, top_p)` in its graph (a `ProcessedDraft` under other processors);
    built and warmed up on first use. Returns them and the seconds this call spent compiling."""
    target_model, seconds = _engine(target, ("target",), max_length, lambda capacity: StaticModel(target, capacity))
    seconds += target_model.warm_lengths(longest_verification)
    if draft is None:
        return target_model, None, seconds
    if any(not isinstance(p, SAMPLING_WARPERS) for p in processing.processors):
        judge = LeanJudge(head, draft.device) if head is not None else None
        with_hidden_states = judge is not None and judge.reads_hidden_states
        forward, draft_seconds = _engine(draft, ("processed draft", with_hidden_states), max_length,
                                         lambda capacity: DraftForward(draft, capacity, with_hidden_states))
        return target_model, ProcessedDraft(forward, processing, judge), seconds + draft_seconds
    draft_model, draft_seconds = _engine(draft, ("draft", sampling, head_shape(head)), max_length,
                                         lambda capacity: CompiledDraft(draft, capacity, sampling, head))
    if head is not None:  # the weights of this head, into the engine of its shape
        draft_model.judge.load(head)
    return target_model, draft_model, seconds + draft_seconds


def compiled_tree_models(target: PreTrainedModel, draft: PreTrainedModel, max_length: int, head, width: int,
                         processing: Processing) -> tuple[TreeModel, TreeModel, float]:
    """The compiled `TreeModel`s of target and draft, empty, for `max_length` tokens, and the compile seconds; greedy
    without processors, the draft's graph also picks each node's `width` children and scores them (with `head`)."""
    length = max_length + TREE_ROWS[-1]  # a round's nodes sit past its prefix until it keeps one path
    target_model, seconds = _engine(target, ("tree target",), length, lambda capacity: TreeModel(target, capacity))
    width = 0 if processing.do_sample or processing.changes_logits else width
    with_hidden_states = head is not None and head.reads_hidden_states
    draft_model, draft_seconds = _engine(
        draft, ("tree draft", with_hidden_states, width, head_shape(head) if width else None), length,
        lambda capacity: TreeModel(draft, capacity, with_hidden_states, width, head, single_row=True))
    if width and head is not None:  # the weights of this head, into the engine of its shape
        draft_model.judge.load(head)
    return target_model, draft_model, seconds + draft_seconds


def head_shape(head: AcceptancePredictionHead | None) -> tuple | None:
    """What a draft graph depends on in a head: its kind and tensor shapes, not its weights."""
    if head is None:
        return None
    tensors = tuple((name, tuple(t.shape), t.dtype) for name, t in head.state_dict().items())
    return head.alignment, tuple(head.features), head.reads_hidden_states, tensors


def _engine(model: PreTrainedModel, key: tuple, max_length: int, build) -> tuple[StaticModel, float]:
    """The engine for `model` and `key` of `capacity_for(max_length)`, reset, else one built by `build(capacity)`;
    warmed up when new or when the state its graphs guard on changed. Returns it and the seconds spent compiling."""
    key = (*key, model.dtype, model.device)  # the graphs do not check the parameters: a cast model gets new ones
    engines, capacity = _engines.setdefault(model, {}), capacity_for(max_length)
    start = time.perf_counter()
    if (engine := engines.get((key, capacity))) is not None:
        engine.reset()
    else:
        with torch.inference_mode(False):  # lasting state, changed in place in any mode: no inference tensors
            engine = engines[key, capacity] = build(capacity)
    if engine.compiled_for == (state := compile_guarded_state()):
        return engine, 0.0
    if engine.compiled_for is not NotImplemented:  # new graphs: a recompile would spend their recompile budget
        engine.build_graphs()
    engine.warm_up()
    engine.compiled_for = state
    return engine, time.perf_counter() - start


def uses_cuda_graphs(device: torch.device) -> bool:
    """Whether graphs on `device` run as CUDA graphs."""
    return device.type == "cuda"


def _compile(method, dynamic: bool | None, cuda: bool):
    """`torch.compile` of a private copy of the bound `method`, so each engine keeps its own graphs,
    guards and recompile budget; guarded on tensors and the global context only (`COMPILE_GUARD_FILTER`)."""
    f = method.__func__
    own = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    options = {"triton.cudagraphs": True} if cuda else {}  # mode="reduce-overhead", which excludes options
    if COMPILE_GUARD_FILTER is not None:
        options["guard_filter_fn"] = COMPILE_GUARD_FILTER
    return torch.compile(types.MethodType(own, method.__self__), fullgraph=True, dynamic=dynamic,
                         options=options or None)


class StaticModel:
    """A causal LM on a `StaticCache` of `capacity` tokens, its length tracked here (no step reads it from the device);
    `with_hidden_states`: its forwards also return the last hidden states (checked to be what a head reads)."""

    def __init__(self, model: PreTrainedModel, capacity: int, with_hidden_states: bool = False):
        if not STATIC_CACHE_CROPS:
            raise ValueError(f"compile=True needs transformers >= 5.24, whose StaticCache crops by moving a counter "
                             f"(the engine's rollback); transformers {TRANSFORMERS_VERSION} is installed: "
                             "upgrade it or decode with compile=False")
        self.model, self.capacity, self.device = model, capacity, model.device
        self.with_hidden_states = with_hidden_states
        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        _check_full_attention(self.cache, model)
        self.model_kwargs = cache_kwargs(model, self.cache)
        self.cuda_graphs = uses_cuda_graphs(self.device)
        self.warm_up_calls = 2 if self.cuda_graphs else 1  # CUDA graph trees record a size's second call
        self.length = self.warmed_lengths = 0
        self.compiled_for = NotImplemented  # the guarded state its graphs were warmed up for: none yet
        with torch.no_grad():  # allocated now, outside inference mode, so that `crop` may change it in any mode
            self._feed([0])
        self.reset()
        self.build_graphs()
        if with_hidden_states:
            _check_last_hidden_state(model)

    def build_graphs(self) -> None:
        """New compiled graphs (compiled on their first call)."""
        self.verify_graph = _compile(self._logits, dynamic=None, cuda=self.cuda_graphs)

    def logits(self, seq: list[int], num_logits: int) -> torch.Tensor:
        """Logits `[num_logits, vocab]` for the last `num_logits` of `seq` (earlier unseen tokens fed eagerly)."""
        self._feed(seq[:-num_logits])
        logits = self._run(self.verify_graph, self._ids(seq[-num_logits:]))
        self.length = len(seq)
        return logits

    def crop(self, length: int) -> None:
        """Forget everything past the first `length` tokens (moves the cache's counter)."""
        if self.length > length:
            self.cache.crop(length - self.length)
            self.length = length

    def reset(self) -> None:
        self.crop(0)

    def take_cache(self, other: StaticModel) -> None:
        """Hold what `other`, an engine of the same model, holds: its cache's entries, copied."""
        copy_static_cache(other.cache, self.cache, other.length)
        self.length = other.length

    def warm_up(self) -> None:
        """Compile the verification graphs for 1, 2 and 3 tokens (the third reuses the dynamic one)."""
        self.warmed_lengths = 0
        self.warm_lengths(3)

    def warm_lengths(self, longest: int) -> float:
        """Run the verification for each length up to `longest` not run since the warm-up until its CUDA graph is
        recorded, so none is recorded mid-generation (elsewhere only the first warm-up runs); returns the seconds."""
        lengths = range(self.warmed_lengths + 1, longest + 1) if self.cuda_graphs or not self.warmed_lengths else ()
        if not lengths:
            return 0.0
        start = time.perf_counter()
        with torch.inference_mode():
            self._feed([0])
            for length in lengths:
                for _ in range(self.warm_up_calls):
                    self.logits([0] * (1 + length), num_logits=length)
                    self.crop(1)
        self.reset()
        self.warmed_lengths = longest
        return time.perf_counter() - start

    def _logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, position_ids=self._positions(input_ids), **self.model_kwargs).logits[0]

    def _positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Positions from the cache's own counter (a tensor), so the graph holds for every length.
        return self.cache.get_seq_length() + torch.arange(input_ids.shape[1], device=input_ids.device)[None]

    def _feed(self, tokens: list[int]) -> None:
        """Eager forward over the tokens the cache has not seen, after cropping it to `tokens`."""
        self.crop(len(tokens))
        if len(tokens) > self.length:  # `_ids` raises past the capacity
            self._logits(self._ids(tokens[self.length:]))
            self.length = len(tokens)

    def _warm_up_steps(self, step) -> None:
        """Run `step(tokens)` after one unseen token and after two until both CUDA graphs are recorded."""
        with torch.inference_mode():
            for tokens in ([0, 0], [0, 0, 0]) * self.warm_up_calls:
                self._feed([0])
                step(tokens)
                self.reset()

    def _new_ids(self, tokens: list[int], *inputs) -> torch.Tensor:
        """A draft graph's input after `tokens`: the one or two unseen last tokens, earlier ones fed first: up to six
        that rounds drafting nothing left behind through the graph itself (with `inputs`), more (a prompt) eagerly."""
        while 3 <= len(tokens) - self.length <= 8:
            ids = self._ids(tokens[self.length:min(self.length + 2, len(tokens) - 2)])
            self._run(self.step_graph, ids, *inputs)
            self.length += ids.shape[1]
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
        torch.compiler.cudagraph_mark_step_begin()  # a CUDA graph's outputs are overwritten by its next replay
        out = graph(*inputs)
        return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()


class CompiledDraft(StaticModel):
    """The draft as one graph per step: forward, warpers (`sampling`), token choice and (with a `head`) judgement."""

    def __init__(self, model: PreTrainedModel, capacity: int, sampling: tuple[float, int, float] | None,
                 head: AcceptancePredictionHead | None):
        super().__init__(model, capacity, head is not None and head.reads_hidden_states)
        self.warpers = make_warpers(*sampling) if sampling is not None else None
        # Its own copy of the weights, read in place by the graph as the cache's are (no copy before a replay).
        self.judge = LeanJudge(head, self.device) if head is not None else None
        if self.judge is not None:
            torch._dynamo.mark_static_address(self.judge.weights)
        self.vocab = vocab_size(model)

    def build_graphs(self) -> None:
        super().build_graphs()
        self.step_graph = _compile(self._step, dynamic=False, cuda=self.cuda_graphs)

    def draft_step(self, tokens: list[int], num_drafted: int, generator: torch.Generator | None) -> DraftStep:
        """The proposal after `tokens`: one graph over the unseen last one or two tokens."""
        noise = None if self.warpers is None else draft_noise(self.vocab, self.device, generator)
        values, probs = self._run(self.step_graph, self._new_ids(tokens, noise), noise)
        self.length = len(tokens)
        token, token_prob, *judged = values.tolist()
        return DraftStep(num_drafted, token_prob, token=int(token), probs=probs, warped=self.warpers is not None,
                         accept_prob=judged[0] if judged else None)

    def warm_up(self) -> None:
        generator = torch.Generator(self.device).manual_seed(0)  # the user's generator is not drawn from
        self._warm_up_steps(lambda tokens: self.draft_step(tokens, 1, generator))

    def _step(self, input_ids: torch.Tensor, noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, position_ids=self._positions(input_ids), logits_to_keep=1,
                         output_hidden_states=self.with_hidden_states, **self.model_kwargs)
        logits = widened(out.logits[0, -1])
        if self.warpers is None:
            probs = raw_probs = logits.softmax(-1)
            token = proposed_token(logits, probs, None)
        else:
            warped = self.warpers(None, logits[None])[0]
            probs, raw_probs = warped.softmax(-1), None
            token = proposed_token(warped, probs, noise)
        # gather: indexing by a tensor breaks the graph
        values = [token.double(), probs.gather(0, token[None])[0].double()]
        if self.judge is not None:  # the eager step's judgement, on the engine's weights
            hidden = out.hidden_states[-1][0, -1] if self.with_hidden_states else None
            values.append(self.judge(hidden, logits, token, raw_probs).double())
        return torch.stack(values), probs


class DraftForward(StaticModel):
    """The draft's forward alone as one graph (last logits and hidden state), for processors that read the prefix."""

    def build_graphs(self) -> None:
        super().build_graphs()
        self.step_graph = _compile(self._step, dynamic=False, cuda=self.cuda_graphs)

    def step(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The draft's raw logits `[vocab]` after `tokens` and (or None) its hidden state there."""
        logits, state = self._run(self.step_graph, self._new_ids(tokens))
        self.length = len(tokens)
        return logits, state if self.with_hidden_states else None

    def warm_up(self) -> None:
        self._warm_up_steps(self.step)

    def _step(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, position_ids=self._positions(input_ids), logits_to_keep=1,
                         output_hidden_states=self.with_hidden_states, **self.model_kwargs)
        state = out.hidden_states[-1][0, -1] if self.with_hidden_states else out.logits.new_zeros(())
        return out.logits[0, -1], state


class ProcessedDraft:
    """One generation's draft under prefix-reading processors: a compiled `DraftForward`, then `proposed_step`."""

    def __init__(self, forward: DraftForward, processing: Processing, judge: LeanJudge | None):
        self.forward, self.processing, self.judge = forward, processing, judge

    def draft_step(self, tokens: list[int], num_drafted: int, generator: torch.Generator | None) -> DraftStep:
        logits, state = self.forward.step(tokens)
        return proposed_step(self.processing, tokens, logits, state, num_drafted, generator, self.judge)

    def crop(self, length: int) -> None:
        self.forward.crop(length)

    def take_cache(self, other: StaticModel) -> None:
        self.forward.take_cache(other)


class TreeModel(StaticModel):
    """A model on a `StaticCache` as a token tree's round feeds it (`CachedModel`'s `forward`, `run` and `keep`): each
    forward one graph over tokens at given positions under a tree's visibility, of any row count up to the last of
    `TREE_ROWS` (to which CUDA graphs pad: a padding row sees itself alone, then leaves the cache) or, `single_row`,
    of one row alone, so that no round compiles; longer inputs (a prompt) run eagerly. Given a `width`, the graph
    also picks each row's `width` most likely children and scores them (`schedules.children_scores`, judged by
    `head` if any): `scored`, the last run's."""

    forward, keep = CachedModel.forward, CachedModel.keep  # a `CachedModel`'s, through this class's `run` and `crop`

    def __init__(self, model: PreTrainedModel, capacity: int, with_hidden_states: bool = False, width: int = 0,
                 head: AcceptancePredictionHead | None = None, single_row: bool = False):
        self.width, self.single_row, self.scored = width, single_row, None
        super().__init__(model, capacity, with_hidden_states)
        self.judge = LeanJudge(head, self.device) if width and head is not None else None
        if self.judge is not None:
            torch._dynamo.mark_static_address(self.judge.weights)

    def build_graphs(self) -> None:
        self.tree_graph = _compile(self._tree_forward, dynamic=None, cuda=self.cuda_graphs)
        self.row_graph = _compile(self._tree_forward, dynamic=False, cuda=self.cuda_graphs)

    def warm_up(self) -> None:
        """Run the graph once per row count (a CUDA graph is recorded on its second call)."""
        with torch.inference_mode():
            for rows in (1,) * self.single_row + TREE_ROWS:
                for _ in range(self.warm_up_calls):
                    self._feed([0])
                    self.run([0] * rows, list(range(1, rows + 1)), None, rows)
            self.reset()

    def run(self, tokens: list[int], positions: list[int], visible: torch.Tensor | None, num_logits: int,
            with_hidden_states: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed `tokens` at `positions` after the cache (`visible`: `[tokens, cached + tokens]`, True where a token
        sees a key; None: causal); the logits `[num_logits, vocab]` of the last `num_logits` and (or None) the hidden
        states there."""
        count, past = len(tokens), self.length
        if count == 1 and self.single_row:
            rows = 1
        elif self.cuda_graphs:  # a CUDA graph is recorded per row count: a few counts
            rows = next((rows for rows in TREE_ROWS if rows >= count), count)
        else:
            rows = max(count, 2)
        seen = torch.zeros(rows, self.capacity, dtype=torch.bool, device=self.device)
        if visible is None:
            seen[:count, :past + count] = torch.ones(count, past + count, dtype=torch.bool,
                                                     device=self.device).tril(past)
        else:
            seen[:count, :past + count] = visible
        if rows > count:
            padding = torch.arange(count, rows, device=self.device)
            seen[padding, past + padding] = True
        ids = self._ids(tokens + [0] * (rows - count))
        inputs = (ids, torch.tensor([positions + positions[-1:] * (rows - count)], device=self.device), seen)
        if rows == 1:
            logits, hidden, scored = self._run(self.row_graph, *inputs)
        elif rows <= TREE_ROWS[-1]:
            for tensor, dim in zip(inputs, (1, 1, 0)):  # one graph for every row count
                torch._dynamo.mark_dynamic(tensor, dim)
            logits, hidden, scored = self._run(self.tree_graph, *inputs)
        else:
            logits, hidden, scored = self._tree_forward(*inputs)
        self.length = past + rows
        self.crop(past + count)
        self.scored = scored[:, count - num_logits:count] if self.width else None
        return logits[count - num_logits:count], hidden[count - num_logits:count] if with_hidden_states else None

    def _tree_forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                      seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, position_ids=position_ids,
                         attention_mask=additive_mask(seen, self.model.dtype)[None, None],
                         output_hidden_states=self.with_hidden_states, **self.model_kwargs)
        logits = out.logits[0]
        hidden = out.hidden_states[-1][0] if self.with_hidden_states else logits.new_zeros(())
        if not self.width:
            return logits, hidden, logits.new_zeros(())
        widened_logits = widened(logits)
        probs = widened_logits.softmax(-1)
        children = probs.topk(self.width, dim=-1).indices
        scores = children_scores(self.judge, False, widened_logits, probs, probs,
                                 hidden if self.with_hidden_states else None, children)
        return logits, hidden, torch.stack([children.double(), scores])


def _check_full_attention(cache: StaticCache, model: PreTrainedModel) -> None:
    """ValueError unless every layer of `cache` is a full-attention `StaticLayer` (others do not crop by a counter)."""
    if layers := special_layers(cache):
        kind = "a sliding-window layer" if is_sliding(layers[0]) else "a layer"
        raise ValueError(f"compile=True: {model.config.model_type} gets {kind} ({type(layers[0]).__name__}) in its "
                         "static cache, and the compiled engine supports full-attention StaticLayer caches only "
                         "(rolled back by moving a counter the graph reads); decode it with compile=False")


def _check_last_hidden_state(model: PreTrainedModel) -> None:
    """ValueError unless the draft's last `output_hidden_states` entry (what heads read) is its output layer's input."""
    output_layer, captured = model.get_output_embeddings(), []
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
