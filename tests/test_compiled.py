"""The compiled engine: the same tokens as the target (greedy) and its distribution (sampling),
graphs compiled once and never again mid-generation, clear refusals."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from conftest import perturbed_copy, tiny_llama
from test_decoding import (HIDDEN, chi_square_pvalue, constant_head, exact_first_two_token_distribution, prompts,
                           random_proposer, target_greedy, tiny_family_model, with_budget_knobs)
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM, MistralConfig

from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.engine import compiled, decoding
from specdecpp.engine.sampling import make_warpers
from specdecpp.engine.schedules import SCHEDULES
from specdecpp.measuring.step_timing import StepProbe


# Before transformers 5.24 a StaticCache cannot crop, and compile=True is refused (tested below).
needs_static_crop = pytest.mark.skipif(not compiled.STATIC_CACHE_CROPS, reason="transformers < 5.24: compile=True "
                                       "is refused (test_a_transformers_without_static_crop_is_refused)")


def compiled_generate(target, draft, prompt, **kwargs):
    return speculative_generate(target, draft, prompt, compile=True, **kwargs)


# Tree schedules on the compiled engine: tests/test_tree.py.
CHAIN_SCHEDULES = [name for name, schedule in SCHEDULES.items() if not schedule.grows_tree]


@pytest.mark.parametrize("schedule", CHAIN_SCHEDULES)
@needs_static_crop
def test_compiled_greedy_equals_target_generate(tiny_pair, schedule):
    target, draft = tiny_pair
    knobs = with_budget_knobs(schedule, head=random_proposer() if schedule == "ada" else None)
    for prompt, max_new_tokens in itertools.product(prompts(5), (1, 9, 40)):
        out = compiled_generate(target, draft, prompt, schedule=schedule, stop_threshold=0.5,
                                max_new_tokens=max_new_tokens, num_assistant_tokens=4, bound=(1, 6), **knobs)
        assert torch.equal(out.sequences, target_greedy(target, prompt, max_new_tokens)), (schedule, prompt)


def test_warm_ups_generate_the_longest_of_each_capacity():
    lengths = [10, 300, 200, 600, 250, 257]  # capacities 256, 512, 256, 1024, 256, 512
    assert [compiled.capacity_for(n) for n in (1, 256, 257, 600)] == [256, 256, 512, 1024]
    assert compiled.longest_per_capacity(lengths, lambda n: n) == [250, 300, 600]


@needs_static_crop
def test_a_generation_runs_on_the_engine_of_its_own_capacity(tiny_pair, monkeypatch):
    """A short generation after a long one builds its own 256-token engine rather than take the 512-token one:
    each step's attention reads the whole cache."""
    monkeypatch.setattr(compiled, "_engines", compiled.weakref.WeakKeyDictionary())
    target, draft = tiny_pair
    long_prompt = torch.arange(250)[None] % 60 + 2
    for prompt, max_new_tokens in ((long_prompt, 10), (prompts(1)[0], 10)):
        out = compiled_generate(target, draft, prompt, max_new_tokens=max_new_tokens)
        assert torch.equal(out.sequences, target_greedy(target, prompt, max_new_tokens))
    assert sorted(capacity for _, capacity in compiled._engines[target]) == [256, 512]


@pytest.mark.parametrize("schedule", ["verify-budget", "ada-budget"])
@needs_static_crop
def test_compiled_budget_rounds_verify_what_the_eager_ones_verify(tiny_pair, schedule):
    """The loop's verify hook runs alike on both engines: the same blocks drafted, the same
    prefixes verified (the in-graph judgement and the compiled draft's distribution score the
    slots as the eager step does), the unverified drafts cropped from the static cache."""
    target, draft = tiny_pair
    knobs = with_budget_knobs(schedule)
    for prompt in prompts(3, seed=4):
        runs = [speculative_generate(target, draft, prompt, schedule=schedule, num_assistant_tokens=5,
                                     max_new_tokens=40, compile=flag, **knobs) for flag in (False, True)]
        assert torch.equal(runs[1].sequences, target_greedy(target, prompt, 40))
        eager, compiled_stats = (run.stats for run in runs)
        assert (eager.draft_lengths, eager.verified_lengths) == (compiled_stats.draft_lengths,
                                                                 compiled_stats.verified_lengths)
        assert compiled_stats.verified_lengths != compiled_stats.draft_lengths


# "proposer" is the kind test_compiled_greedy_equals_target_generate runs (the same graphs); the margin is judged in
# the graph by default in test_compiled_and_eager_sample_the_same_tokens_from_the_same_generator.
@pytest.mark.parametrize("head_kind", ["proposer", "hidden alone, projected",
                                       *(pytest.param(kind, marks=pytest.mark.slow)
                                         for kind in ("reader", "proposer+margin", "features alone"))])
@needs_static_crop
def test_compiled_greedy_equals_target_generate_with_every_kind_of_head(tiny_pair, head_kind):
    target, draft = tiny_pair
    torch.manual_seed(3)
    head = {"reader": AcceptancePredictionHead(HIDDEN, num_layers=2),
            "proposer": random_proposer(),
            "proposer+margin": random_proposer(features=("log_q", "entropy", "margin")),
            "hidden alone, projected": random_proposer(features=(), width=8),  # the zoo head's kind
            "features alone": random_proposer(0, ("log_q", "entropy", "margin"))}[head_kind]
    if head_kind == "reader":
        with torch.no_grad():
            for p in head.parameters():
                p.normal_(0, 0.5)
    lengths = set()
    for prompt in prompts(5, seed=3):
        out = compiled_generate(target, draft, prompt, schedule="ada", head=head, stop_threshold=0.5,
                                max_new_tokens=30, bound=(1, 6))
        assert torch.equal(out.sequences, target_greedy(target, prompt, 30)), prompt
        lengths.update(out.stats.draft_lengths)
    assert len(lengths) > 2  # the in-graph judgements really varied the rounds


@needs_static_crop
def test_compiled_judgement_is_the_eager_one(tiny_pair):
    """The head's P(accept) computed inside the draft graph equals the eager loop's, round by round,
    for each of two heads of one shape (they share an engine, the second's weights copied in)."""
    target, draft = tiny_pair
    prompt = prompts(1, seed=5)[0]
    lengths = []
    for seed in (0, 1):
        head = random_proposer(seed=seed)  # the kind the greedy tests compile (the margin: the sampling test below)
        runs = [speculative_generate(target, draft, prompt, schedule="ada", head=head, stop_threshold=0.5,
                                     max_new_tokens=40, bound=(1, 6), compile=flag).stats for flag in (False, True)]
        assert runs[0].draft_lengths == runs[1].draft_lengths
        assert seed == 0 or runs[1].compile_time == 0
        lengths.append(runs[0].draft_lengths)
    assert lengths[0] != lengths[1]  # the heads judged differently, and the engine followed each


@needs_static_crop
def test_compiled_eos_inside_a_round_and_the_length_limit_mid_round(tiny_pair):
    target, _ = tiny_pair
    prompt = prompts(1, seed=4)[0]
    continuation = target_greedy(target, prompt, 30)[0, prompt.shape[1]:].tolist()
    eos = continuation[12]
    expected = target_greedy(target, prompt, 30, eos_token_id=eos)
    for draft in (target, perturbed_copy(target, 0.01)):  # an identical draft proposes EOS inside a run
        out = compiled_generate(target, draft, prompt, schedule="constant", num_assistant_tokens=6, max_new_tokens=30,
                                eos_token_id=[999, eos])
        assert torch.equal(out.sequences, expected)
        for max_new_tokens in (7, 11):  # rounds of 7 tokens: the limit falls inside a round
            out = compiled_generate(target, draft, prompt, schedule="constant", num_assistant_tokens=6,
                                    max_new_tokens=max_new_tokens, eos_token_id=[])
            assert torch.equal(out.sequences, target_greedy(target, prompt, max_new_tokens, eos_token_id=None))


@needs_static_crop
def test_a_draft_left_behind_by_rounds_drafting_nothing_catches_up_through_its_graph(tiny_pair, monkeypatch):
    """The oracle drafts nothing where the draft is wrong. After two such rounds the draft is three tokens behind
    and feeds the oldest through its step graph; only the prompt is fed eagerly, before the draft's first step."""
    target, _ = tiny_pair
    draft, prompt = perturbed_copy(target, 0.03), prompts(4, seed=6)[3]  # wrong at every other token or so
    compiled_generate(target, draft, prompt, schedule="oracle", max_new_tokens=60)  # engines built and warmed up
    fed_eagerly, feed = [], compiled.StaticModel._feed

    def counted_feed(model, tokens):
        if isinstance(model, compiled.CompiledDraft) and len(tokens) > model.length:
            fed_eagerly.append(len(tokens) - model.length)
        feed(model, tokens)

    monkeypatch.setattr(compiled.StaticModel, "_feed", counted_feed)
    out = compiled_generate(target, draft, prompt, schedule="oracle", max_new_tokens=60, eos_token_id=[])
    assert torch.equal(out.sequences, target_greedy(target, prompt, 60, eos_token_id=None))
    lengths = out.stats.draft_lengths
    assert any(a == b == 0 for a, b in zip(lengths, lengths[1:]))
    assert len(fed_eagerly) == 1 and fed_eagerly[0] >= prompt.shape[1] - 1  # the prompt (and rounds before the first)


@pytest.mark.slow  # compiles every family
@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "qwen2", "opt"])
@needs_static_crop
def test_compiled_greedy_equal_across_model_families(family):
    target, draft = tiny_family_model(family, seed=0), tiny_family_model(family, seed=1)
    head = random_proposer()
    for schedule, prompt in itertools.product(("constant", "ada"), prompts(3, seed=2)):
        out = compiled_generate(target, draft, prompt, schedule=schedule, head=head, stop_threshold=0.5,
                                num_assistant_tokens=3, max_new_tokens=20, bound=(1, 6))
        assert torch.equal(out.sequences, target_greedy(target, prompt, 20)), (family, schedule)


VOCAB = 6


@pytest.mark.slow  # compiles sampling graphs; the default run checks they sample as the eager engine does (below)
@pytest.mark.parametrize("schedule,settings", [
    ("ada-proposer", dict(top_p=0.9)),
    ("dynamic", dict(temperature=0.8)),
    ("ada", dict(top_k=5)),
])
@needs_static_crop
def test_compiled_sampling_follows_the_target_distribution(schedule, settings):
    target = tiny_llama(vocab_size=VOCAB, seed=0, initializer_range=0.5)
    draft = tiny_llama(vocab_size=VOCAB, seed=5, initializer_range=0.5)
    prompt = torch.tensor([[1, 4, 2]])
    head, threshold = AcceptancePredictionHead(HIDDEN, num_layers=1), 0.5
    if schedule == "ada-proposer":  # this fresh proposer head judges about 0.2: a higher threshold varies its rounds
        schedule, threshold = "ada", 0.9
        torch.manual_seed(0)
        head = AcceptancePredictionHead(HIDDEN, 1, alignment="proposer", features=["log_q", "entropy"])
    generator = torch.Generator().manual_seed(0)
    samples, lengths = [], set()
    for _ in range(1000):
        out = compiled_generate(target, draft, prompt, schedule=schedule, head=head, stop_threshold=threshold,
                                bound=(1, 4), num_assistant_tokens=3, assistant_confidence_threshold=0.3, max_new_tokens=4, do_sample=True,
                                generator=generator, **settings)
        samples.append(tuple(out.sequences[0, 3:5].tolist()))
        lengths.add(out.stats.draft_lengths[0])
    warpers = make_warpers(**settings)
    assert chi_square_pvalue(samples, exact_first_two_token_distribution(target, prompt, warpers)) > 1e-3
    assert chi_square_pvalue(samples, exact_first_two_token_distribution(draft, prompt, warpers)) < 1e-6
    assert len(lengths) > 1


@pytest.mark.slow  # compiles sampling graphs
@needs_static_crop
def test_compiled_sampling_is_reproducible_with_a_generator(tiny_pair):
    target, draft = tiny_pair
    runs = [compiled_generate(target, draft, prompts(1)[0], schedule="dynamic", max_new_tokens=30, do_sample=True,
                              generator=torch.Generator().manual_seed(11)).sequences for _ in range(2)]
    assert torch.equal(*runs)


@pytest.mark.parametrize("schedule,settings", [
    ("ada", dict(temperature=0.8, top_k=20, top_p=0.9)),  # the compiled draft: warpers, choice, judgement in its graph
    ("ada", dict(repetition_penalty=1.3, top_p=0.9)),  # the processed draft: its choice made after its graph
    pytest.param("dynamic", dict(temperature=0.8, top_k=20, top_p=0.9), marks=pytest.mark.slow),
])
@needs_static_crop
def test_compiled_and_eager_sample_the_same_tokens_from_the_same_generator(tiny_pair, schedule, settings):
    """One way to sample: the compiled step's argmax of `probs / E` (E ~ Exp(1) drawn from the
    user's generator) is the draw torch's `multinomial` makes with the same generator, so both
    engines give the same sequences and rounds for a seed, rejections and residual draws included."""
    target, draft = tiny_pair
    head = random_proposer(features=("log_q", "entropy", "margin")) if schedule == "ada" else None

    def generate(prompt, seed, compile):
        return speculative_generate(target, draft, prompt, schedule=schedule, head=head, stop_threshold=0.5,
                                    bound=(1, 6), max_new_tokens=30, do_sample=True, compile=compile,
                                    generator=torch.Generator().manual_seed(seed), **settings)

    discarded, seeds_differ = 0, False
    for prompt in prompts(3, seed=7):
        eager, compiled_ = (generate(prompt, 5, flag) for flag in (False, True))
        assert torch.equal(eager.sequences, compiled_.sequences), prompt
        assert eager.stats.draft_lengths == compiled_.stats.draft_lengths
        discarded += eager.stats.discarded_tokens
        seeds_differ |= not torch.equal(eager.sequences, generate(prompt, 6, True).sequences)
    assert discarded > 0  # rejections happened, so the residual draws were compared too
    assert seeds_differ  # the generator, not the models alone, decided the tokens


@pytest.mark.slow  # compile mechanics
@needs_static_crop
def test_graphs_compile_once_and_never_again_mid_generation(tiny_pair):
    """After the first call, prompts of other lengths and rounds of every length up to the bound
    compile nothing (decoding runs with recompilation forbidden, so a recompile would also raise)."""
    target, draft = tiny_pair
    always = constant_head(20.0, alignment="proposer", features=[])
    settings = dict(schedule="ada", head=always, stop_threshold=0.5, bound=(1, 12))
    first = compiled_generate(target, target, prompts(1)[0], max_new_tokens=3, **settings)  # a fresh draft key
    assert first.stats.compile_time > 0
    frames, lengths = counters["stats"]["unique_graphs"], set()
    assert frames > 0  # the counter counts compiled graphs
    for prompt, max_new_tokens in zip(itertools.cycle(prompts(8, seed=6)), range(1, 15)):  # prompts of 1..22 tokens
        out = compiled_generate(target, target, prompt, max_new_tokens=max_new_tokens, **settings)
        assert out.stats.compile_time == 0
        lengths.update(out.stats.draft_lengths)
    assert lengths == set(range(13))  # every round length up to the bound, each verified by the same graphs
    assert counters["stats"]["unique_graphs"] == frames


@needs_static_crop
def test_step_timing_between_generations_leaves_the_shared_engines_sound(tiny_pair):
    """Step probes time the engines generations use: a probe on a context shorter than the
    generations between them neither disturbs the next generation nor times a garbage cache."""
    target, draft = tiny_pair
    probe = StepProbe(target, draft, prompts(1, seed=8)[0][:, :4], max_draft=4, compile=True)
    for prompt in prompts(3, seed=9):
        out = compiled_generate(target, draft, prompt, schedule="constant", num_assistant_tokens=4, max_new_tokens=40)
        assert torch.equal(out.sequences, target_greedy(target, prompt, 40))
        probe.sample()
    assert probe.times().engine == "compiled" and probe.passes == 3


@pytest.mark.slow  # compile mechanics
@pytest.mark.skipif(compiled.COMPILE_GUARD_FILTER is None, reason="this torch has no guard filter: every guard runs")
def test_graphs_check_their_tensors_and_the_global_context_only():
    """An engine's graph does not check its owner's plain attributes or parameters again before each call
    (they stay as built; in-place changes are read), but does check its inputs' shapes and the grad mode."""
    class Owner(torch.nn.Module):
        scale = 2.0

        def __init__(self):
            super().__init__()
            self.shift = torch.nn.Parameter(torch.zeros(2))

        def times(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale + self.shift

    owner = Owner()
    graph = compiled._compile(owner.times, dynamic=False, cuda=False)
    with torch.inference_mode():
        assert graph(torch.ones(2)).tolist() == [2.0, 2.0]
        owner.scale = 3.0
        with torch.no_grad():
            owner.shift.fill_(1.0)
        with compiled.recompiles_forbidden():
            assert graph(torch.ones(2)).tolist() == [3.0, 3.0]  # the scale as built, the parameter as it is
            owner.shift = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
            graph(torch.ones(2))  # a parameter of another dtype: not checked, no new graph
            with pytest.raises(RuntimeError, match="recompil"):
                graph(torch.ones(3))
    with compiled.recompiles_forbidden(), pytest.raises(RuntimeError, match="recompil"):
        graph(torch.ones(2))  # grad mode on: a new graph


@pytest.mark.slow  # compile mechanics
@needs_static_crop
def test_a_model_cast_after_compiling_decodes_on_new_graphs():
    """The graphs do not check their parameters, so a model cast to another dtype gets new engines, and
    its output stays its own greedy output; `clear_engines` makes every engine anew."""
    target = tiny_llama(seed=4)
    draft = perturbed_copy(target, noise=0.01)
    prompt = prompts(1, seed=3)[0]
    assert compiled_generate(target, draft, prompt, max_new_tokens=8).stats.compile_time > 0
    target.float(), draft.float()
    out = compiled_generate(target, draft, prompt, max_new_tokens=8)
    assert out.stats.compile_time > 0
    assert torch.equal(out.sequences, target_greedy(target, prompt, 8))
    compiled.clear_engines()  # what a user calls after changing what the graphs do not check
    again = compiled_generate(target, draft, prompt, max_new_tokens=8)
    assert again.stats.compile_time > 0 and torch.equal(again.sequences, out.sequences)


@pytest.mark.slow  # compile mechanics
@needs_static_crop
def test_a_model_class_built_after_compiling_recompiles_before_a_generation_not_during(tiny_pair):
    """Building a model of a new class changes state transformers' forwards read (and the graphs
    guard on): the next generation warms its engines up again instead of failing mid-way."""
    target, draft = tiny_pair
    prompt = prompts(1, seed=3)[0]
    compiled_generate(target, draft, prompt, max_new_tokens=5)
    type("FreshLlamaForCausalLM", (type(target),), {})(target.config)
    out = compiled_generate(target, draft, prompt, max_new_tokens=12)
    assert out.stats.compile_time > 0
    assert torch.equal(out.sequences, target_greedy(target, prompt, 12))
    assert compiled_generate(target, draft, prompt, max_new_tokens=12).stats.compile_time == 0


@pytest.mark.slow  # compile mechanics
@needs_static_crop
def test_warming_up_again_compiles_new_graphs_within_the_recompile_budget(tiny_pair):
    """Each re-warm-up (after a model class is built) compiles graphs of its own, so a long process
    that builds many model classes never exhausts a graph's recompile budget (here lowered to the
    two entries the verification's warm-up makes)."""
    target, draft = tiny_pair
    prompt = prompts(1, seed=3)[0]
    compiled_generate(target, draft, prompt, max_new_tokens=5)
    # torch's own patch: monkeypatch (pytest >= 9.2) undoes by delattr, which hides the entry for good
    with torch._dynamo.config.patch(recompile_limit=2):
        for n in range(3):
            type(f"FreshLlamaForCausalLM{n}", (type(target),), {})(target.config)
            out = compiled_generate(target, draft, prompt, max_new_tokens=6)
            assert out.stats.compile_time > 0 and torch.equal(out.sequences, target_greedy(target, prompt, 6))


def test_a_transformers_without_static_crop_is_refused(tiny_pair, monkeypatch):
    monkeypatch.setattr(compiled, "STATIC_CACHE_CROPS", False)
    monkeypatch.setattr(compiled, "_engines", compiled.weakref.WeakKeyDictionary())
    with pytest.raises(ValueError, match="compile=True needs transformers >= 5.24"):
        compiled_generate(*tiny_pair, prompts(1)[0], max_new_tokens=4)


@needs_static_crop
def test_sliding_window_caches_are_refused():
    config = MistralConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, sliding_window=8)
    target = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="sliding-window layer .*StaticSlidingWindowLayer"):
        compiled_generate(target, None, prompts(1)[0], max_new_tokens=4)
    assert speculative_generate(target, None, prompts(1)[0], max_new_tokens=4).sequences.shape[1] > 1  # eager works


@needs_static_crop
def test_a_head_reading_a_state_the_graph_cannot_see_is_refused(tiny_pair, monkeypatch):
    target, _ = tiny_pair
    draft = tiny_llama(seed=9)
    monkeypatch.setattr(draft, "get_output_embeddings", lambda: None)
    with pytest.raises(ValueError, match="last hidden state is not its output layer's input"):
        compiled_generate(target, draft, prompts(1)[0], schedule="ada", head=random_proposer(), max_new_tokens=4)


def _moving_lazy_initialization(monkeypatch):
    """Make the static cache's first allocation copy its counter, as `.to("cuda")` does on a GPU
    (on the CPU `.to` returns the same tensor, so a counter made in inference mode never shows)."""
    from transformers.cache_utils import StaticLayer
    original = StaticLayer.lazy_initialization

    def lazy_initialization(self, key_states, value_states):
        self.cumulative_length = self.cumulative_length.clone()
        original(self, key_states, value_states)

    monkeypatch.setattr(StaticLayer, "lazy_initialization", lazy_initialization)


@needs_static_crop
def test_engines_hold_no_inference_tensors_so_they_crop_outside_inference_mode(tiny_pair, monkeypatch):
    """Every tensor of an engine's cache is an ordinary one, whichever mode the first forward ran
    in, so `crop` and `reset` work outside inference mode (on CUDA the cache allocates its counter
    in its first forward)."""
    _moving_lazy_initialization(monkeypatch)
    target, draft = tiny_pair
    for engine in (compiled.StaticModel(target, 256), compiled.CompiledDraft(draft, 256, None, random_proposer())):
        engine.warm_up()
        engine._feed([1, 2, 3])
        engine.crop(1)
        layers = engine.cache.layers
        assert not any(t.is_inference() for layer in layers for t in (layer.keys, layer.values,
                                                                       layer.cumulative_length))
        assert all(int(layer.cumulative_length) == 1 for layer in layers)


@needs_static_crop
def test_the_draft_graph_reads_the_judges_weights_in_place(tiny_pair):
    """The compiled draft's judge weights are static addresses, as the cache's tensors are: CUDA graphs
    read them where they are, and a head of the same shape is copied into them, not beside them."""
    engine = compiled.CompiledDraft(tiny_pair[1], 256, None, random_proposer(seed=0))
    weights, other = engine.judge.weights, random_proposer(seed=1)
    assert getattr(weights, "_dynamo_static_input_type", None)
    address = weights.data_ptr()
    engine.judge.load(other)
    assert engine.judge.weights.data_ptr() == address
    assert torch.equal(engine.judge.weights, compiled.LeanJudge(other).weights)


@needs_static_crop
def test_engines_built_inside_the_callers_inference_mode_decode_outside_it():
    """A compiled generation run inside the caller's `torch.inference_mode()` builds engines that the
    next generation, outside it, resets and loads another head into."""
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1)  # models of their own: engines built here
    prompt = prompts(1, seed=3)[0]
    with torch.inference_mode():
        inside = compiled_generate(target, draft, prompt, schedule="ada", head=random_proposer(seed=0),
                                   stop_threshold=0.5, max_new_tokens=12)
    outside = compiled_generate(target, draft, prompt, schedule="ada", head=random_proposer(seed=1),
                                stop_threshold=0.5, max_new_tokens=12)
    assert outside.stats.compile_time == 0  # the engines built inside were reused
    assert inside.sequences.tolist() == outside.sequences.tolist() == target_greedy(target, prompt, 12).tolist()


@pytest.mark.slow  # compiles the CUDA-graph branch's graphs
@needs_static_crop
def test_compiled_engine_with_cuda_graph_steps_equals_target_generate(tiny_pair, monkeypatch):
    """The branch a GPU takes (CUDA graphs, a step marked before each replay and its
    outputs cloned out of the graph's pool) keeps greedy output the target's; on the CPU the
    compiler skips the CUDA graphs themselves. Every graph a generation replays, of every input size,
    ran twice in the warm-up: CUDA graph trees run a size's first call eagerly and record the second,
    so none is recorded mid-generation."""
    monkeypatch.setattr(compiled, "uses_cuda_graphs", lambda device: True)
    calls, unrecorded, warming = Counter(), [], [False]
    run, warm = compiled.StaticModel._run, compiled.compiled_models

    def counted_run(engine, graph, *inputs):
        key = (id(graph), inputs[0].shape[1])
        if calls[key] < 2 and not warming[0]:
            unrecorded.append((type(engine).__name__, key[1]))
        calls[key] += 1
        return run(engine, graph, *inputs)

    def warming_up(*args, **kwargs):
        warming[0] = True
        try:
            return warm(*args, **kwargs)
        finally:
            warming[0] = False
    monkeypatch.setattr(compiled.StaticModel, "_run", counted_run)
    monkeypatch.setattr(decoding, "compiled_models", warming_up)
    compiled.clear_engines()
    target, draft = tiny_pair
    try:
        for schedule, knobs in (("ada", {"head": random_proposer()}), ("dynamic", {})):
            for prompt in prompts(2, seed=7):
                out = compiled_generate(target, draft, prompt, schedule=schedule, stop_threshold=0.5,
                                        max_new_tokens=24, bound=(1, 6), **knobs)
                assert torch.equal(out.sequences, target_greedy(target, prompt, 24)), (schedule, prompt)
                assert max(out.stats.verified_lengths) + 1 <= 7
        assert not unrecorded
    finally:
        compiled.clear_engines()
