"""Token trees: the mask gives every node its path's logits, the caches keep the accepted path as if fed alone,
a tree of width 1 is the chain, the output is the target's (greedy) or follows its distribution (sampling), and
bad input fails clearly."""
from __future__ import annotations

import itertools

import pytest
import torch
from conftest import HIDDEN, tiny_llama
from test_compiled import needs_static_crop
from test_decoding import (BUDGET_TIMES, chi_square_pvalue, exact_first_two_token_distribution, prompts,
                           random_proposer, target_greedy)
from transformers import LlamaForCausalLM

from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.costs import StepTimes
from specdecpp.engine import schedules
from specdecpp.engine.compiled import compiled_tree_models
from specdecpp.engine.decoding import GenerationStats, tree_round
from specdecpp.engine.draft_step import CachedModel, EagerDraft
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.sampling import make_warpers
from specdecpp.engine.schedules import MAX_TREE_NODES, PILOT_ROUNDS, ROOT, Ada, AdaTree, ConfidenceTree
from specdecpp.engine.tree import Candidate, TokenTree, scored_children, tree_visibility
from specdecpp.head.model import LeanJudge

TREE_SCHEDULES = ("ada-tree", "confidence-tree")
FLAT = StepTimes(draft_ms=[0.1] * 4, verify_ms=[1.0] * 9, target_alone_ms=1.0)  # a GPU's: every length alike


def tree_of(parents: list[int], tokens: list[int]) -> TokenTree:
    tree = TokenTree()
    for parent, token in zip(parents, tokens):
        tree.add(Candidate(parent, 0, token, 1.0))
    return tree


def test_the_mask_gives_every_node_the_logits_of_its_path_alone(tiny_pair):
    target, _ = tiny_pair
    seq = [5, 9, 2, 7]
    tree = tree_of([ROOT, ROOT, 0, 0, 2, 1], [11, 12, 13, 14, 15, 16])
    model = CachedModel(target)
    model.forward(seq[:-1], num_logits=1)
    prefix = len(seq)
    causal = torch.zeros(1, prefix + len(tree), dtype=torch.bool)
    causal[:, :prefix] = True
    positions = [prefix - 1] + [prefix - 1 + depth for depth in tree.depths]
    logits, _ = model.run(seq[-1:] + tree.tokens, positions, torch.cat([causal, tree_visibility(tree, prefix)]),
                          len(tree) + 1)
    with torch.no_grad():
        for row, node in enumerate([None, *range(len(tree))]):
            path = seq + (tree.path_tokens(node) if node is not None else [])
            alone = target(input_ids=torch.tensor([path])).logits[0, -1]
            torch.testing.assert_close(logits[row], alone, rtol=1e-9, atol=1e-9)


def cache_tensors(model) -> list[torch.Tensor]:
    """Every layer's keys and values of the tokens `model`'s cache holds."""
    return [t[:, :, :model.length] for layer in model.cache.layers for t in (layer.keys, layer.values)]


@needs_static_crop
@pytest.mark.parametrize("scorer", ["head of features", "head of the state", "confidence"])
def test_the_compiled_draft_picks_and_scores_children_as_the_eager_engine_does(tiny_pair, scorer):
    target, draft = tiny_pair
    head = None if scorer == "confidence" else random_proposer(features=("log_q", "log_rank", "log_left")
                                                               if scorer == "head of features" else ())
    policy = ConfidenceTree(3, 8, 0.9, (1, 4), False) if head is None else AdaTree(head, 3, 8, 0.9, (1, 4), False)
    processing = sampling_only(False)
    _, compiled_draft, _ = compiled_tree_models(target, draft, 64, head, policy.width, processing)
    eager_draft = EagerDraft(draft, processing, LeanJudge(head) if head is not None else None)
    seq, siblings = [5, 9, 2, 7, 4], [3, 11]
    picked = []
    with torch.inference_mode():
        for model in (compiled_draft, eager_draft):
            model.forward(seq[:-1], num_logits=1)
            for tokens in ([seq[-1]], siblings):  # the root's row, then a level of two nodes
                past = len(seq) - 1 if len(tokens) == 1 else len(seq)
                visible = torch.ones(len(tokens), past + len(tokens), dtype=torch.bool)
                visible[:, past:] = torch.eye(len(tokens), dtype=torch.bool)
                rows, states = model.run(tokens, [past] * len(tokens), visible, len(tokens), model.with_hidden_states)
                picked.append(scored_children(model, policy, seq, [[]] * len(tokens), rows, states, processing, None))
    assert compiled_draft.scored is not None and eager_draft.__dict__.get("scored") is None
    for (tokens, scores, _), (eager_tokens, eager_scores, _) in zip(picked[:2], picked[2:]):
        assert tokens == eager_tokens and len(tokens[0]) == policy.width
        torch.testing.assert_close(torch.tensor(scores), torch.tensor(eager_scores), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine", ["eager", pytest.param("compiled", marks=needs_static_crop)])
@pytest.mark.parametrize("schedule", TREE_SCHEDULES)
def test_after_a_round_each_cache_is_that_of_the_accepted_path_alone(tiny_pair, schedule, engine):
    target, draft = tiny_pair
    head = random_proposer()
    policy = ConfidenceTree(3, 8, 0.9, (1, 4), False) if schedule == "confidence-tree" \
        else AdaTree(head, 3, 8, 0.9, (1, 4), False)
    processing = sampling_only(False)
    for prompt in prompts(4, seed=3):
        seq = prompt[0].tolist()
        if engine == "compiled":
            target_model, draft_model, _ = compiled_tree_models(
                target, draft, 64, head if schedule == "ada-tree" else None, policy.width, processing)
        else:
            target_model = CachedModel(target)
            draft_model = EagerDraft(draft, processing, LeanJudge(head) if schedule == "ada-tree" else None)
        policy.start_round()
        with torch.inference_mode():
            accepted, token, size = tree_round(target_model, draft_model, seq, policy, 4, processing, None,
                                               GenerationStats())
        assert size >= len(accepted)
        kept = seq + accepted
        for stepped, model in ((target_model, target), (draft_model, draft)):
            alone = CachedModel(model)
            alone.forward(kept[:stepped.length], num_logits=1)
            assert stepped.length >= len(seq)
            for packed, fed in zip(cache_tensors(stepped), cache_tensors(alone)):
                # The compiled graph rotates positions in float32 in its own order: a misplaced entry is off by O(1).
                tolerance = dict(rtol=1e-4, atol=1e-5) if engine == "compiled" else dict(rtol=1e-9, atol=1e-9)
                torch.testing.assert_close(packed, fed, **tolerance)
        assert target_model.length == len(kept)
        # Greedy: the accepted path and the added token are the target's own continuation.
        assert kept + [token] == target_greedy(target, prompt, len(accepted) + 1)[0].tolist()


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_tree_of_width_one_drafts_the_chain_of_ada(tiny_pair, do_sample):
    target, draft = tiny_pair
    head = random_proposer()
    for prompt in prompts(4, seed=1):
        runs = []
        for schedule in ("ada", "ada-tree"):
            extra = dict(tree_width=1, tree_nodes=MAX_TREE_NODES) if schedule == "ada-tree" else {}
            out = speculative_generate(target, draft, prompt, schedule=schedule, head=head, stop_threshold=0.5,
                                       bound=(1, 6), max_new_tokens=30, do_sample=do_sample,
                                       generator=torch.Generator().manual_seed(7), **extra)
            runs.append((out.sequences.tolist(), out.stats.draft_lengths, out.stats.accepted_lengths,
                         out.stats.draft_calls))
        assert runs[0] == runs[1]


@pytest.mark.parametrize("schedule", TREE_SCHEDULES)
@pytest.mark.parametrize("tree_nodes,tree_width", [(6, 3), ("auto", 2), (1, 4)])
def test_greedy_trees_equal_target_generate(tiny_pair, schedule, tree_nodes, tree_width):
    target, draft = tiny_pair
    head = random_proposer() if schedule == "ada-tree" else None
    sizes = set()
    for prompt, max_new_tokens in [(p, n) for p in prompts(5, seed=4) for n in (1, 13, 40)]:
        out = speculative_generate(target, draft, prompt, schedule=schedule, head=head, stop_threshold=0.6,
                                   bound=(1, 5), tree_nodes=tree_nodes, tree_width=tree_width,
                                   step_times=BUDGET_TIMES, max_new_tokens=max_new_tokens)
        assert torch.equal(out.sequences, target_greedy(target, prompt, max_new_tokens)), (prompt, max_new_tokens)
        sizes.update(out.stats.draft_lengths)
    assert len(sizes) > 1 or tree_nodes == 1


@needs_static_crop
@pytest.mark.parametrize("schedule", TREE_SCHEDULES)
def test_compiled_trees_equal_the_target_and_grow_the_eager_trees(tiny_pair, schedule):
    # Each round pads its forwards to a few row counts compiled in the warm-up: decoding runs with
    # recompilation forbidden, so a round that needed a new graph would fail here.
    target, draft = tiny_pair
    head = random_proposer() if schedule == "ada-tree" else None
    sizes = set()
    for prompt, max_new_tokens, (tree_nodes, tree_width) in itertools.product(
            prompts(4, seed=4), (1, 40), [(6, 3), ("auto", 2)]):
        runs = [speculative_generate(target, draft, prompt, schedule=schedule, head=head, stop_threshold=0.6,
                                     bound=(1, 5), tree_nodes=tree_nodes, tree_width=tree_width,
                                     step_times=BUDGET_TIMES, max_new_tokens=max_new_tokens, compile=flag)
                for flag in (False, True)]
        assert torch.equal(runs[1].sequences, target_greedy(target, prompt, max_new_tokens)), (prompt, max_new_tokens)
        eager, compiled_stats = (run.stats for run in runs)
        assert (eager.draft_lengths, eager.accepted_lengths, eager.draft_calls) == \
            (compiled_stats.draft_lengths, compiled_stats.accepted_lengths, compiled_stats.draft_calls)
        sizes.update(compiled_stats.draft_lengths)
    assert len(sizes) > 2


def features_head(seed: int = 0) -> AcceptancePredictionHead:
    """A proposer head of features whose judgement varies with the token judged (so siblings score apart)."""
    return random_proposer(HIDDEN, ("log_q", "margin", "log_rank"), seed=seed)


@pytest.mark.parametrize("schedule,settings", [
    ("ada-tree", dict(top_k=5)),
    pytest.param("confidence-tree", dict(temperature=0.8), marks=pytest.mark.slow),
    pytest.param("ada-tree", dict(), marks=pytest.mark.slow),
    pytest.param("ada-tree", dict(top_k=5, compile=True), marks=[pytest.mark.slow, needs_static_crop]),
    pytest.param("confidence-tree", dict(compile=True), marks=[pytest.mark.slow, needs_static_crop]),
])
def test_sampled_trees_follow_the_target_distribution(small_vocab_pair, schedule, settings):
    target, draft = small_vocab_pair
    prompt = torch.tensor([[1, 4, 2]])
    head = features_head() if schedule == "ada-tree" else None
    generator = torch.Generator().manual_seed(0)
    samples, sizes = [], set()
    for _ in range(1000):
        out = speculative_generate(target, draft, prompt, schedule=schedule, head=head, bound=(1, 3),
                                   stop_threshold=0.8, tree_nodes=5, tree_width=3, max_new_tokens=2, do_sample=True,
                                   generator=generator, **settings)
        samples.append(tuple(out.sequences[0, 3:5].tolist()))
        sizes.update(out.stats.draft_lengths)
    assert len(sizes) > 1
    warpers = make_warpers(**{k: v for k, v in settings.items() if k != "compile"})
    assert chi_square_pvalue(samples, exact_first_two_token_distribution(target, prompt, warpers)) > 1e-3
    assert chi_square_pvalue(samples, exact_first_two_token_distribution(draft, prompt, warpers)) < 1e-6


def test_a_sampled_auto_tree_handing_over_to_the_chain_follows_the_target_distribution(small_vocab_pair,
                                                                                      monkeypatch):
    # After one tree round the chain drafts the rest (dear levels): the second token comes from either.
    monkeypatch.setattr(schedules, "PILOT_ROUNDS", 1)
    target, draft = small_vocab_pair
    prompt, generator = torch.tensor([[1, 4, 2]]), torch.Generator().manual_seed(0)
    dear_levels = StepTimes(draft_ms=[0.1] * 8, verify_ms=[1.0] * 9, target_alone_ms=1.0, level_ms=[5.0, 6.0, 7.0])
    samples, handed_over = [], 0
    for _ in range(1000):
        out = speculative_generate(target, draft, prompt, schedule="ada-tree", head=features_head(), bound=(1, 3),
                                   stop_threshold=0.8, tree_nodes="auto", tree_width=3, step_times=dear_levels,
                                   max_new_tokens=2, do_sample=True, generator=generator)
        samples.append(tuple(out.sequences[0, 3:5].tolist()))
        handed_over += out.stats.tree_rounds < out.stats.target_calls
    assert handed_over > 100
    assert chi_square_pvalue(samples, exact_first_two_token_distribution(target, prompt, make_warpers())) > 1e-3
    assert chi_square_pvalue(samples, exact_first_two_token_distribution(draft, prompt, make_warpers())) < 1e-6


class IgnoresTheMask(LlamaForCausalLM):
    """A model that drops the attention mask it is given (as one that cannot take a 4D mask would)."""

    def forward(self, *args, attention_mask=None, **kwargs):
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize("change,message", [
    (dict(tree_nodes=0), "tree_nodes must be an int in"),
    (dict(tree_nodes=MAX_TREE_NODES + 1), "tree_nodes must be an int in"),
    (dict(tree_nodes="many"), "tree_nodes must be an int in"),
    (dict(tree_width=0), "tree_width must be an int in"),
    (dict(head=AcceptancePredictionHead(HIDDEN, 1)), "needs a proposer head"),
    (dict(schedule="confidence-tree", stop_threshold="auto"), "confidence-tree' has no stored threshold"),
    (dict(schedule="confidence-tree", tree_nodes="auto", step_times=None), "step_times=StepTimes"),
    (dict(target="ignores-mask"), "does not honour a 4D attention mask"),
])
def test_bad_tree_input_fails_clearly(tiny_pair, change, message):
    target, draft = tiny_pair
    kwargs = dict(schedule="ada-tree", head=random_proposer(), stop_threshold=0.5, tree_nodes=8,
                  step_times=BUDGET_TIMES) | change
    if kwargs.get("target") == "ignores-mask":
        kwargs["target"] = IgnoresTheMask(target.config).to(target.dtype).eval()
        kwargs["target"].load_state_dict(target.state_dict())
    with pytest.raises(ValueError, match=message):
        speculative_generate(kwargs.pop("target", target), draft, torch.tensor([[1, 2, 3]]), max_new_tokens=4,
                             **kwargs)


def test_auto_tree_nodes_grow_with_flat_verification_prices(tiny_pair):
    """Where a verification costs the same at every length (a GPU's), `auto` fills trees to the budget's width;
    where it grows steeply, it admits fewer nodes."""
    target, draft = tiny_pair
    flat = FLAT
    steep = StepTimes(draft_ms=[0.05] * 8, verify_ms=[1.0 + 2.0 * k for k in range(9)], target_alone_ms=1.0)
    sizes = {}
    for name, times in (("flat", flat), ("steep", steep)):
        out = speculative_generate(target, draft, prompts(1, seed=9)[0], schedule="confidence-tree",
                                   stop_threshold=0.9, bound=(1, 4), tree_width=3, step_times=times, max_new_tokens=30)
        sizes[name] = sum(out.stats.draft_lengths) / len(out.stats.draft_lengths)
    assert sizes["flat"] > sizes["steep"]


def test_tiny_llama_in_float32_too():
    """The float32 path (the zoo pair's dtype) keeps greedy identity."""
    target = tiny_llama(seed=2, dtype=torch.float32)
    draft = tiny_llama(seed=2, dtype=torch.float32, num_layers=1)
    for prompt in prompts(3, seed=6):
        out = speculative_generate(target, draft, prompt, schedule="confidence-tree", stop_threshold=0.9,
                                   tree_nodes=8, max_new_tokens=20)
        assert torch.equal(out.sequences, target_greedy(target, prompt, 20))


def candidates(*rows) -> list[Candidate]:
    """Candidates from (parent, rank, score, depth) rows, valued as the schedule values them (greedy)."""
    policy = ConfidenceTree(4, 8, 0.5, (1, 8), False)
    drafted = []
    for parent, rank, score, depth in rows:
        parent_value = 1.0 if parent == ROOT else drafted[parent].path_value
        drafted += policy.valued([Candidate(parent, rank, 100 + len(drafted), score, depth)], parent_value)
    return drafted


def test_selection_keeps_the_most_valuable_nodes_under_kept_parents():
    # root -> 0 (0.9) -> 2 (0.9 * 0.8) -> 4 (0.72 * 0.5); root -> 1 (0.08) -> 3 (0.08 * 0.9)
    drafted = candidates((ROOT, 0, 0.9, 1), (ROOT, 1, 0.08, 1), (0, 0, 0.8, 2), (1, 0, 0.9, 2), (2, 0, 0.5, 3))
    assert ConfidenceTree(4, 3, 0.5, (1, 8), False).select(drafted, [1, 1, 1]) == [0, 2, 4]
    assert ConfidenceTree(4, 5, 0.5, (1, 8), False).select(drafted, [1, 1, 1]) == [0, 2, 4, 1, 3]
    # Steep verification: a node only while its value pays for the verification's growth at the round's rate
    # (node 4: 0.36 x 1.9 ms < 2.62 tokens x 0.3 ms).
    steep = StepTimes(draft_ms=[0.1] * 4, verify_ms=[1.0 + 0.3 * k for k in range(9)], target_alone_ms=1.0)
    assert ConfidenceTree(4, "auto", 0.5, (1, 8), False, steep).select(drafted, [1, 1, 1]) == [0, 2]
    assert ConfidenceTree(4, "auto", 0.5, (1, 8), False, FLAT).select(drafted, [1, 1, 1]) == [0, 2, 4, 1, 3]


def test_sampled_selection_values_a_sibling_by_its_chance_of_being_tried():
    policy = ConfidenceTree(4, 2, 0.5, (1, 8), True)
    siblings = policy.valued([Candidate(ROOT, rank, 7 + rank, score) for rank, score in enumerate((0.3, 0.9, 0.5))],
                             1.0)
    assert [c.value for c in siblings] == pytest.approx([1.0, 0.7, 0.07])  # not their own scores
    assert [c.path_value for c in siblings] == pytest.approx([0.3, 0.63, 0.035])
    assert policy.select(siblings, [1]) == [0, 1]


def test_auto_expands_a_level_only_while_its_values_pay_for_its_price_at_its_width():
    # Two root children (path values 0.6 and 0.5) both keep the product rule: the next level would expand both.
    # Flat verification (1 ms), so both are verified: 2.1 expected tokens for 1 ms + the root level's price.
    newest = candidates((ROOT, 0, 0.6, 1), (ROOT, 1, 0.5, 1))

    def expanded(level_ms):
        times = StepTimes(draft_ms=[0.1], verify_ms=[1.0] * 4, target_alone_ms=1.0, level_ms=level_ms)
        return ConfidenceTree(2, "auto", 0.5, (1, 8), False, times).expand(newest, newest, [1])

    assert expanded([0.1, 0.2]) == [0, 1]  # 1.1 tokens x 1.1 ms >= 2.1 tokens x 0.2 ms
    assert expanded([0.1, 0.7]) == []  # 1.1 x 1.1 < 2.1 x 0.7: a level of two nodes costs too much


def test_auto_weighs_its_trees_against_the_chain_ada_would_draft():
    # First children 0 -> 2 -> 4 (survival 0.9, 0.72, 0.36): the chain at 0.5 drafts all three (it stops once
    # 1 - 0.36 > 0.5), 2.98 expected tokens for 3 draft steps and a verification of 3: 1.3 ms at FLAT. The tree
    # [0, 2, 4, 1, 3] expects 3.132 for its three levels and a verification of 5: 1.3 ms at the chain's steps.
    drafted = candidates((ROOT, 0, 0.9, 1), (ROOT, 1, 0.08, 1), (0, 0, 0.8, 2), (1, 0, 0.9, 2), (2, 0, 0.5, 3))
    chain = Ada(random_proposer(), 0.5, (1, 8))
    for level_ms, prefers_chain in (([], False), ([0.2, 0.4], True)):  # levels 0.2 + 0.4 + 0.4 ms: 3.132 / 2 ms < 2.98 / 1.3
        times = StepTimes(draft_ms=[0.1] * 4, verify_ms=[1.0] * 9, target_alone_ms=1.0, level_ms=level_ms)
        policy = ConfidenceTree(4, "auto", 0.5, (1, 8), False, times, chain)
        for rounds in range(1, PILOT_ROUNDS + 1):
            policy.weigh(drafted, [0, 2, 4, 1, 3], [1, 2, 2] if level_ms else [1, 1, 1])
            assert policy.prefers_chain() == (prefers_chain and rounds == PILOT_ROUNDS)
        assert policy.tally[1:] == pytest.approx([x * PILOT_ROUNDS for x in (3.132, 2.0 if level_ms else 1.3, 2.98, 1.3)])


def test_auto_prices_levels_as_its_rounds_ran_them():
    times = StepTimes(draft_ms=[0.1] * 4, verify_ms=[1.0] * 9, target_alone_ms=1.0, level_ms=[0.5, 0.6])
    policy = ConfidenceTree(2, "auto", 0.5, (1, 8), False, times)
    policy.observe_levels([1], 0.001)  # the root's level alone: nothing to go by
    assert policy.times is times
    policy.observe_levels([1, 1, 2], 0.0022)  # levels after the root 2.2 ms, priced 0.5 + 0.6
    assert policy.times.level_ms == pytest.approx([1.0, 1.2])
    policy.observe_levels([1, 2], 0.0003)  # all rounds: 2.5 ms for 1.7 priced
    assert policy.times.level_ms == pytest.approx([0.5 * 2.5 / 1.7, 0.6 * 2.5 / 1.7])
    sized = ConfidenceTree(2, 16, 0.5, (1, 8), False, times)
    sized.observe_levels([1, 1, 2], 0.0022)
    assert sized.times is times  # a tree of a given size prices nothing


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=[pytest.mark.slow, needs_static_crop])])
def test_an_auto_tree_hands_over_to_the_chain_where_its_prices_rate_the_chain_higher(tiny_pair, compile):
    target, draft = tiny_pair
    head = random_proposer()
    dear_levels = StepTimes(draft_ms=[0.1] * 8, verify_ms=[1.0] * 9, target_alone_ms=1.0, level_ms=[5.0, 6.0])
    for prompt in prompts(3, seed=4):
        handed_over, kept = (speculative_generate(target, draft, prompt, schedule="ada-tree", head=head,
                                                  stop_threshold=0.6, bound=(1, 5), tree_nodes="auto", tree_width=2,
                                                  step_times=times, max_new_tokens=40, compile=compile).stats
                             for times in (dear_levels, FLAT))
        assert handed_over.tree_rounds == PILOT_ROUNDS < handed_over.target_calls
        assert kept.tree_rounds == kept.target_calls
        assert [len(stats.tree_level_widths) for stats in (handed_over, kept)] == [PILOT_ROUNDS, kept.target_calls]
        out = speculative_generate(target, draft, prompt, schedule="ada-tree", head=head, stop_threshold=0.6,
                                   bound=(1, 5), tree_nodes="auto", tree_width=2, step_times=dear_levels,
                                   max_new_tokens=40, compile=compile)
        assert torch.equal(out.sequences, target_greedy(target, prompt, 40))
