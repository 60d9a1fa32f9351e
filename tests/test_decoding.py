"""The decode loop: lossless (greedy identical to the target; sampling distributed as the
target), the stats add up, EOS and length limits, bounds, clear errors."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import HIDDEN, VOCAB, perturbed_copy, randomized, tiny_llama, tiny_recurrent
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM, Gemma2Config, GPT2Config, GPTNeoXConfig, OPTConfig, Qwen2Config

from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.compat import SLIDING_WINDOW_ROLLS_BACK
from specdecpp.costs import StepTimes
from specdecpp.engine.draft_step import CachedModel, EagerDraft
from specdecpp.engine.online import OnlineAcceptanceEstimator
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.sampling import make_warpers, widened
from specdecpp.engine.schedules import SCHEDULES, VerifyBudget
from specdecpp.engine.settings import DecodingSettings
from specdecpp.head.model import LeanJudge



def target_greedy(target, prompt: torch.Tensor, max_new_tokens: int, eos_token_id=None) -> torch.Tensor:
    return target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                           max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, pad_token_id=eos_token_id)


def prompts(n: int, vocab_size: int = 64, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (1, 1 + (3 * i) % 11), generator=generator) for i in range(n)]


def constant_head(accept_logit: float, **config) -> AcceptancePredictionHead:
    """A head whose prediction ignores its input: accept with probability sigmoid(accept_logit)."""
    head = AcceptancePredictionHead(HIDDEN, num_layers=1, **config)
    with torch.no_grad():
        head.model[-1].weight.zero_()
        head.model[-1].bias.copy_(torch.tensor([0.0, accept_logit]))
    return head


def random_proposer(hidden_size: int = HIDDEN, features: tuple[str, ...] = ("log_q", "entropy"),
                    seed: int = 4, width: int | None = None) -> AcceptancePredictionHead:
    torch.manual_seed(seed)
    head = AcceptancePredictionHead(hidden_size, num_layers=2, alignment="proposer", features=list(features),
                                    width=width)
    return randomized(head)


@pytest.fixture(scope="module")
def random_proposer_head():
    return random_proposer()


# Made-up prices under which a verification grows steeply with its length, so that the budget
# schedules verify fewer tokens than they draft in many rounds (and all of them in some).
BUDGET_TIMES = StepTimes(draft_ms=[0.2] * 8, verify_ms=[1.0 + 0.5 * k for k in range(9)], target_alone_ms=1.0,
                         judge_ms=0.05)


def with_budget_knobs(schedule: str, **knobs) -> dict:
    """`knobs` for `schedule`, plus what a budget or tree schedule needs in tests that run every schedule:
    step times (`BUDGET_TIMES`) and, for `ada-budget` and `ada-tree`, a proposer head in place of `knobs`'s."""
    if schedule in ("ada-budget", "ada-tree"):
        knobs["head"] = random_proposer()
    if schedule.endswith("-tree"):
        knobs.setdefault("stop_threshold", 0.5)
    return knobs | ({"step_times": BUDGET_TIMES} if SCHEDULES[schedule].prices_rounds(DecodingSettings(schedule=schedule))
                    else {})


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_greedy_equals_target_generate(tiny_pair, random_head, schedule):
    target, draft = tiny_pair
    knobs = with_budget_knobs(schedule, head=random_head)
    for prompt, max_new_tokens in itertools.product(prompts(6), (1, 9, 40)):
        expected = target_greedy(target, prompt, max_new_tokens)
        out = speculative_generate(target, draft, prompt, schedule=schedule, max_new_tokens=max_new_tokens,
                                   num_assistant_tokens=4, bound=(2, 6), **knobs)
        assert torch.equal(out.sequences, expected), (schedule, prompt, max_new_tokens)


@pytest.mark.parametrize("head_kind", ["hidden+features", "hidden+margin", "features alone"])
def test_greedy_equals_target_generate_with_a_proposer_head(tiny_pair, random_proposer_head, head_kind):
    target, draft = tiny_pair
    random_proposer_head = {"hidden+features": random_proposer_head,
                            "hidden+margin": random_proposer(features=("log_q", "entropy", "margin")),
                            "features alone": random_proposer(0, ("log_q", "entropy", "margin"))}[head_kind]
    lengths = set()
    for prompt, max_new_tokens in itertools.product(prompts(6), (1, 9, 40)):
        expected = target_greedy(target, prompt, max_new_tokens)
        for bound in ((1, 6), (2, 6)):
            out = speculative_generate(target, draft, prompt, schedule="ada", head=random_proposer_head,
                                       stop_threshold=0.5, max_new_tokens=max_new_tokens, bound=bound)
            assert torch.equal(out.sequences, expected), (prompt, max_new_tokens, bound)
            lengths.update(out.stats.draft_lengths)
    assert len(lengths) > 2  # the head's judgements really varied the rounds


def test_greedy_equals_target_generate_while_estimators_learn_across_generations(tiny_pair, random_proposer_head):
    """`online` and `ada` with online recalibration, each with one estimator carried over every
    generation and refitting often, so that its coefficients (hence the rounds) keep changing."""
    target, draft = tiny_pair
    for schedule in ("online", "ada"):
        estimator = OnlineAcceptanceEstimator.recalibration(6, refit_interval=3) if schedule == "ada" \
            else OnlineAcceptanceEstimator(6, refit_interval=3)
        lengths = set()
        for prompt, max_new_tokens in itertools.product(prompts(6), (9, 40)):
            out = speculative_generate(target, draft, prompt, schedule=schedule, head=random_proposer_head,
                                       stop_threshold=0.5, bound=(1, 6), online=schedule == "ada",
                                       estimator=estimator, max_new_tokens=max_new_tokens)
            assert torch.equal(out.sequences, target_greedy(target, prompt, max_new_tokens)), (schedule, prompt)
            lengths.update(out.stats.draft_lengths)
        assert estimator.refits > 10 and len(lengths) > 2, schedule
        assert estimator.intercepts != OnlineAcceptanceEstimator.recalibration(6).intercepts


@pytest.mark.parametrize("draft_kind", ["identical", "unrelated"])
def test_greedy_equal_with_always_and_never_agreeing_drafts(tiny_pair, draft_kind):
    """An identical draft exercises fully accepted rounds (bonus token, two-token catch-up of
    the draft's cache); an unrelated one exercises a rejection in almost every round."""
    target, _ = tiny_pair
    draft = target if draft_kind == "identical" else tiny_llama(seed=7)
    for prompt in prompts(4, seed=1):
        out = speculative_generate(target, draft, prompt, schedule="constant", num_assistant_tokens=3, max_new_tokens=30)
        assert torch.equal(out.sequences, target_greedy(target, prompt, 30))
        if draft_kind == "identical":
            assert out.stats.discarded_tokens == 0 and all(a == d for a, d in zip(out.stats.accepted_lengths, out.stats.draft_lengths))


def tiny_family_model(family: str, seed: int):
    torch.manual_seed(seed)
    common = dict(vocab_size=64, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = {
        "gpt2": lambda: GPT2Config(n_layer=2, n_embd=HIDDEN, n_head=4, initializer_range=0.3, **common),
        "gpt_neox": lambda: GPTNeoXConfig(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, initializer_range=0.3, **common),
        "qwen2": lambda: Qwen2Config(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=64, initializer_range=0.3, **common),
        "opt": lambda: OPTConfig(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                                 word_embed_proj_dim=HIDDEN, init_std=0.3, **common),
        # Soft-capped logits, and a sliding window shorter than the prompts.
        "gemma2": lambda: Gemma2Config(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=HIDDEN // 4, intermediate_size=64, sliding_window=8,
                                       final_logit_softcapping=2.0, initializer_range=0.3, **common),
    }[family]()
    return AutoModelForCausalLM.from_config(config).to(torch.float64).eval()


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "qwen2", "opt", "gemma2"])
def test_greedy_equal_across_model_families(family, random_head):
    target = tiny_family_model(family, seed=0)
    draft = tiny_family_model(family, seed=1)
    if family == "gemma2" and not SLIDING_WINDOW_ROLLS_BACK:
        with pytest.raises(ValueError, match="sliding-window attention, whose cache transformers .* cannot roll back"):
            speculative_generate(target, draft, prompts(1, seed=2)[0], schedule="constant", max_new_tokens=20)
        return
    for schedule, prompt in itertools.product(("constant", "ada", "verify-budget", "ada-budget"), prompts(3, seed=2)):
        out = speculative_generate(target, draft, prompt, schedule=schedule, num_assistant_tokens=3, max_new_tokens=20,
                                   **with_budget_knobs(schedule, head=random_head))
        assert torch.equal(out.sequences, target_greedy(target, prompt, 20)), (family, schedule)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "qwen2", "opt", "gemma2"])
def test_the_hidden_state_the_loop_reads_is_the_last_layer_output(family, tiny_pair):
    """The loop's logits are the model's and the state it reads is the model's last hidden state (training's
    `hidden_states[-1]`), at the prefill and at every step after it, whether it steps the base model and the
    output layer or the model whole."""
    model = tiny_pair[1] if family == "llama" else tiny_family_model(family, seed=1)
    cached, whole, seq = CachedModel(model), CachedModel(model), prompts(1, seed=4)[0][0].tolist()
    whole.split = False  # the model's own forward at every step
    with torch.inference_mode():
        # The prefill, then a draft step, a verification of two drafted tokens and another step.
        for fed in ([], [7], [9, 3, 5], [11]):
            seq, num_logits = seq + fed, max(len(fed), 1)
            logits, state = cached.forward(seq, num_logits=num_logits, with_hidden_states=True)
            full = model(input_ids=torch.tensor([seq]), output_hidden_states=True)
            torch.testing.assert_close(state, full.hidden_states[-1][0, -1])
            torch.testing.assert_close(logits, full.logits[0, -num_logits:])
            # Bit for bit what the model's own forward on the same cache gives.
            whole_logits, whole_state = whole.forward(seq, num_logits=num_logits, with_hidden_states=True)
            assert torch.equal(logits, whole_logits) and torch.equal(state, whole_state)
    # Stepped whole: OPT's causal LM runs its base model's decoder, not the base model; Gemma 2 caps its logits.
    assert cached.split is (family not in ("opt", "gemma2"))


def test_a_greedy_step_judged_by_a_head_of_the_state_alone_computes_no_distribution(tiny_pair):
    """Nothing reads the draft's distribution there; a plain step (`dynamic` reads its token's probability) and
    a step judged by a head of logit features compute it; the token is the draft's argmax either way."""
    draft, seq = tiny_pair[1], prompts(1, seed=4)[0][0].tolist()
    heads = {features: AcceptancePredictionHead(HIDDEN, num_layers=1, alignment="proposer", features=list(features))
             for features in ((), ("log_q",))}
    with torch.inference_mode():
        expected = int(draft(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
        for judge, computes in ((None, True), (LeanJudge(heads[()]), False), (LeanJudge(heads[("log_q",)]), True)):
            step = EagerDraft(draft, sampling_only(False), judge).draft_step(seq, 1, None)
            assert (step.probs is not None, math.isnan(step.token_prob)) == (computes, not computes)
            assert step.token == expected and (step.accept_prob is None) == (judge is None)


def test_eos_inside_a_draft_run_stops_where_the_target_stops(tiny_pair):
    target, _ = tiny_pair
    prompt = prompts(1, seed=4)[0]
    continuation = target_greedy(target, prompt, 30)[0, prompt.shape[1]:].tolist()
    eos = continuation[12]  # a token the target emits mid-generation
    expected = target_greedy(target, prompt, 30, eos_token_id=eos)
    # An identical draft proposes EOS inside a run of accepted tokens.
    for draft in (target, perturbed_copy(target, 0.01)):
        for schedule in ("constant", "heuristic", "oracle"):
            out = speculative_generate(target, draft, prompt, schedule=schedule, num_assistant_tokens=6,
                                       max_new_tokens=30, eos_token_id=[999, eos])
            assert torch.equal(out.sequences, expected)
            assert out.sequences[0, -1] == eos and out.stats.generated_length == continuation.index(eos) + 1


def test_eos_from_the_generation_config(tiny_pair):
    target, draft = tiny_pair
    prompt = prompts(1, seed=4)[0]
    eos = target_greedy(target, prompt, 30)[0, prompt.shape[1] + 5].item()
    target.generation_config.eos_token_id = eos
    try:
        out = speculative_generate(target, draft, prompt, schedule="constant", max_new_tokens=30)
    finally:
        target.generation_config.eos_token_id = None
    assert out.sequences[0, -1] == eos and eos not in out.sequences[0, prompt.shape[1]:-1].tolist()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stats_add_up(tiny_pair, random_head, schedule):
    target, draft = tiny_pair
    for prompt in prompts(3, seed=5):
        stats = speculative_generate(target, draft, prompt, schedule=schedule, max_new_tokens=37,
                                     num_assistant_tokens=4, **with_budget_knobs(schedule, head=random_head)).stats
        rounds = len(stats.accepted_lengths)
        assert stats.generated_length == 37 == sum(stats.accepted_lengths) + rounds
        assert stats.target_calls == rounds == len(stats.draft_lengths) == len(stats.verified_lengths)
        if SCHEDULES[schedule].grows_tree:  # a draft forward per level, at most the bound's 20 levels a round
            assert rounds <= stats.draft_calls <= 20 * rounds
        else:
            assert stats.draft_calls == sum(stats.draft_lengths)
        assert stats.discarded_tokens == sum(stats.draft_lengths) - sum(stats.accepted_lengths)
        assert all(0 <= a <= v <= d for a, v, d in zip(stats.accepted_lengths, stats.verified_lengths,
                                                         stats.draft_lengths))
        if not schedule.endswith("-budget"):
            assert stats.verified_lengths == stats.draft_lengths
        assert stats.wall_time > 0
        assert stats.draft_time + stats.verify_time + stats.schedule_time <= stats.wall_time
        assert stats.verify_time > 0 and (stats.draft_time > 0) == (stats.draft_calls > 0)
        if schedule == "constant":  # exactly K, except where the length limit cuts the last rounds
            assert all(d == min(4, 37 - sum(stats.accepted_lengths[:i]) - i - 1) for i, d in enumerate(stats.draft_lengths))
        if schedule == "none":
            assert stats.target_calls == 37 and stats.draft_calls == 0
        if schedule == "oracle":
            assert stats.discarded_tokens == 0


def brute_force_verify_length(survival: list[float], drafted: int, times: StepTimes, judged: bool) -> int:
    """The n in 0..drafted with the most expected tokens, 1 + survival[0] + ... + survival[n - 1],
    per millisecond of a round that drafts `drafted` tokens (judging each when `judged`) and
    verifies the first n, each rate computed on its own; the first best, so ties go to the shorter."""
    rates = [(1 + sum(survival[:n])) / (sum(times.draft_ms[:drafted]) + times.judge_ms * drafted * judged
                                        + times.verify_ms[n]) for n in range(drafted + 1)]
    return max(range(drafted + 1), key=lambda n: (rates[n], -n))


@pytest.mark.parametrize("schedule", ["verify-budget", "ada-budget"])
def test_budget_rounds_verify_the_brute_force_prefix_and_pay_for_the_whole_block(tiny_pair, monkeypatch, schedule):
    """Round by round, the engine verifies the n that a brute-force search picks on the survival
    scores it recorded; the unverified drafts count as draft calls and as discarded, and the
    estimator learns only from verified tokens (accepted ones and the first rejected)."""
    target, draft = tiny_pair
    recorded = []
    choose = VerifyBudget.verify_length
    monkeypatch.setattr(VerifyBudget, "verify_length", lambda self, num_drafted: recorded.append(
        (list(self.survival), num_drafted)) or choose(self, num_drafted))
    estimator = OnlineAcceptanceEstimator(5, refit_interval=4, history=[])
    knobs = with_budget_knobs(schedule, estimator=estimator)
    verified, labelled = set(), 0
    for prompt in prompts(4, seed=6):
        recorded.clear()
        stats = speculative_generate(target, draft, prompt, schedule=schedule, num_assistant_tokens=5,
                                     max_new_tokens=40, **knobs).stats
        assert [drafted for _, drafted in recorded] == stats.draft_lengths
        assert stats.verified_lengths == [brute_force_verify_length(survival, drafted, BUDGET_TIMES,
                                                                    schedule == "ada-budget")
                                          for survival, drafted in recorded]
        assert all(len(survival) == drafted for survival, drafted in recorded)
        assert stats.draft_calls == sum(stats.draft_lengths) > sum(stats.verified_lengths) > 0
        assert stats.discarded_tokens == sum(stats.draft_lengths) - sum(stats.accepted_lengths)
        verified.update(stats.verified_lengths)
        labelled += sum(min(a + 1, v) for a, v in zip(stats.accepted_lengths, stats.verified_lengths))
    assert len(verified) > 2, verified  # the rule really varied the verified prefix
    if schedule == "verify-budget":  # the accepted tokens and the first rejected one, of those verified
        assert len(estimator.history) == labelled and estimator.refits > 0


def test_budget_rounds_verify_the_whole_block_at_flat_prices(tiny_pair):
    """When a verification costs the same whatever its length (a GPU at batch 1), verifying one
    more drafted token only adds expected tokens: the rule verifies the block, as constant K does."""
    target, draft = tiny_pair
    flat = StepTimes(draft_ms=[0.2] * 8, verify_ms=[1.0] * 9, target_alone_ms=1.0)
    for prompt in prompts(3, seed=7):
        stats = speculative_generate(target, draft, prompt, schedule="verify-budget", num_assistant_tokens=4,
                                     max_new_tokens=30, step_times=flat).stats
        constant = speculative_generate(target, draft, prompt, schedule="constant", num_assistant_tokens=4,
                                        max_new_tokens=30).stats
        assert stats.verified_lengths == stats.draft_lengths == constant.draft_lengths


def test_budget_step_times_default_to_those_stored_with_the_head(tiny_pair):
    target, draft = tiny_pair
    prompt = prompts(1, seed=8)[0]
    head = random_proposer()
    head.threshold_selection = {"step_times": BUDGET_TIMES.as_dict(), "judged_step_times": BUDGET_TIMES.as_dict()}
    for schedule in ("verify-budget", "ada-budget"):
        runs = [speculative_generate(target, draft, prompt, schedule=schedule, head=head, num_assistant_tokens=4,
                                     max_new_tokens=30, **times).stats.verified_lengths
                for times in ({}, {"step_times": BUDGET_TIMES})]
        assert runs[0] == runs[1], schedule


@pytest.mark.parametrize("bound", [(3, 7), (2, 9), (5, 5)])
def test_ada_bounds_with_always_reject_and_always_accept_heads(tiny_pair, bound):
    target, draft = tiny_pair
    prompt = prompts(1, seed=6)[0]
    low, high = bound
    never = speculative_generate(target, draft, prompt, schedule="ada", head=constant_head(-30.0), bound=bound,
                                 stop_threshold=0.3, max_new_tokens=200).stats
    always = speculative_generate(target, draft, prompt, schedule="ada", head=constant_head(30.0), bound=bound,
                                  stop_threshold=0.3, max_new_tokens=200).stats
    # Every round but a last one shortened by the length limit.
    assert set(never.draft_lengths[:-1]) == {low}
    assert set(always.draft_lengths[:-1]) == {high}


@pytest.mark.parametrize("config,lengths", [
    # reader: y_j is judged one step later, so the round stops after y_j once 1 - 0.9^(j-1) > threshold
    (dict(), [(0.05, 2), (0.15, 3), (0.3, 5), (0.5, 8)]),
    # proposer: y_j is judged as it is drafted, so the round stops once 1 - 0.9^j > threshold
    (dict(alignment="proposer", features=["log_q"]), [(0.05, 1), (0.15, 2), (0.3, 4), (0.5, 7)]),
])
def test_ada_threshold_sets_round_length(tiny_pair, config, lengths):
    """P(accept) = 0.9 per token: the round lengths the stop rule predicts, for either alignment."""
    target, draft = tiny_pair
    head = constant_head(float(torch.logit(torch.tensor(0.9))), **config)
    prompt = prompts(1, seed=6)[0]
    for threshold, expected_length in lengths:
        stats = speculative_generate(target, draft, prompt, schedule="ada", head=head, bound=(1, 20),
                                     stop_threshold=threshold, max_new_tokens=200).stats
        assert set(stats.draft_lengths[:-1]) == {expected_length}, threshold


def test_auto_threshold_is_the_stored_one(tiny_pair):
    target, draft = tiny_pair
    prompt = prompts(1, seed=6)[0]
    head = constant_head(float(torch.logit(torch.tensor(0.9))), alignment="proposer").with_threshold(0.3, {})
    stats = speculative_generate(target, draft, prompt, schedule="ada", head=head, bound=(1, 20),
                                 stop_threshold="auto", max_new_tokens=200).stats
    assert set(stats.draft_lengths[:-1]) == {4}
    with pytest.raises(ValueError, match="stored threshold"):
        speculative_generate(target, draft, prompt, schedule="ada", head=constant_head(0.0), stop_threshold="auto")


def test_ada_head_runs_in_its_own_dtype(tiny_pair, random_head):
    """A bf16 draft with an fp32 head: the head casts the hidden state, the output is unchanged."""
    target, draft = tiny_pair
    draft_bf16 = perturbed_copy(target, 0.01).to(torch.bfloat16)
    prompt = prompts(1, seed=8)[0]
    out = speculative_generate(target, draft_bf16, prompt, schedule="ada", head=random_head.float(), max_new_tokens=25)
    assert torch.equal(out.sequences, target_greedy(target, prompt, 25))
    assert out.stats.draft_calls > 0


def test_dynamic_stops_below_the_confidence_threshold(tiny_pair):
    target, draft = tiny_pair
    prompt = prompts(1)[0]
    never_confident = speculative_generate(target, draft, prompt, schedule="dynamic", num_assistant_tokens=8,
                                           assistant_confidence_threshold=1.0, max_new_tokens=40).stats
    always_confident = speculative_generate(target, draft, prompt, schedule="dynamic", num_assistant_tokens=8,
                                            assistant_confidence_threshold=0.0, max_new_tokens=40).stats
    assert set(never_confident.draft_lengths[:-1]) == {1}
    assert set(always_confident.draft_lengths[:-1]) == {8}


def test_max_new_tokens_zero_returns_the_prompt(tiny_pair):
    target, draft = tiny_pair
    prompt = prompts(1)[0]
    out = speculative_generate(target, draft, prompt, schedule="constant", max_new_tokens=0)
    assert torch.equal(out.sequences, prompt) and out.stats.target_calls == 0


def test_streamer_receives_the_prompt_then_every_token(tiny_pair):
    class Collector:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    target, draft = tiny_pair
    prompt = prompts(1, seed=2)[0]
    streamer = Collector()
    out = speculative_generate(target, draft, prompt, schedule="heuristic", max_new_tokens=20, streamer=streamer)
    assert streamer.ended and streamer.chunks[0] == prompt[0].tolist()
    assert sum(streamer.chunks, []) == out.sequences[0].tolist()
    assert len(streamer.chunks) == 1 + out.stats.target_calls


# -- sampling: the output distribution is the target's ---------------------------------------------

def exact_first_two_token_distribution(target, prompt, warpers) -> torch.Tensor:
    """P(x1, x2) under the target with the same logits processing, `[VOCAB * VOCAB]`."""
    with torch.no_grad():
        p1 = warpers(None, widened(target(prompt).logits[:, -1])).softmax(-1)[0]
        rows = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
        p2 = warpers(None, widened(target(rows).logits[:, -1])).softmax(-1)
    return (p1[:, None] * p2).reshape(-1)


def chi_square_pvalue(samples: list[tuple[int, int]], expected_probs: torch.Tensor) -> float:
    """Goodness of fit of joint (x1, x2) counts, pooling cells expected fewer than 5 times."""
    counts = torch.zeros(VOCAB * VOCAB)
    for x1, x2 in samples:
        counts[x1 * VOCAB + x2] += 1
    if counts[expected_probs == 0].sum() > 0:  # an impossible outcome was sampled
        return 0.0
    expected = expected_probs * len(samples)
    possible = expected > 0
    counts, expected = counts[possible], expected[possible]
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    return chisquare(counts.numpy(), expected.numpy() * len(samples) / expected.sum().item()).pvalue


# One end-to-end case runs by default (the acceptance step itself: test_sampling.py); the others are slow.
@pytest.mark.parametrize("schedule,settings", [
    ("ada-online", dict(top_k=5)),
    *(pytest.param(*case, marks=pytest.mark.slow) for case in [
        ("constant", dict()),
        ("constant", dict(temperature=0.7, top_k=4)),
        ("heuristic", dict(top_p=0.8)),
        ("ada", dict(temperature=1.3)),
        ("ada-proposer", dict(top_k=5)),
        ("ada-proposer", dict()),  # unwarped: the head's features reuse the draft step's softmax
        ("ada-features-alone", dict(temperature=0.8)),
        ("online", dict(temperature=0.8)),
    ]),
])
def test_sampling_follows_the_target_distribution(small_vocab_pair, schedule, settings):
    target, draft = small_vocab_pair
    prompt = torch.tensor([[1, 4, 2]])
    head = AcceptancePredictionHead(HIDDEN, num_layers=1)  # fresh head: P(accept) = 0.5, varied round lengths
    if schedule == "ada-proposer":  # a fresh head's output layer reads the features: varied round lengths
        schedule, head = "ada", AcceptancePredictionHead(HIDDEN, 1, alignment="proposer", features=["log_q", "entropy"])
    if schedule == "ada-features-alone":
        schedule, head = "ada", random_proposer(0, ("log_q", "entropy", "margin"), seed=0)
    online = schedule == "ada-online"
    if online:
        schedule, head = "ada", AcceptancePredictionHead(HIDDEN, 1, alignment="proposer", features=["log_q", "entropy"])
    # One estimator learns over all the generations, refitting often: its rounds depend on the outcomes so far.
    estimator = (OnlineAcceptanceEstimator.recalibration(4, refit_interval=5) if online
                 else OnlineAcceptanceEstimator(4, refit_interval=5))
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(1000):
        out = speculative_generate(target, draft, prompt, schedule=schedule, head=head, bound=(1, 4),
                                   num_assistant_tokens=3, max_new_tokens=2, do_sample=True, stop_threshold=0.5,
                                   online=online, estimator=estimator if online or schedule == "online" else None,
                                   generator=generator, **settings)
        samples.append(tuple(out.sequences[0, 3:5].tolist()))
    if online or schedule == "online":
        assert estimator.refits > 100
    warpers = make_warpers(**settings)
    assert chi_square_pvalue(samples, exact_first_two_token_distribution(target, prompt, warpers)) > 1e-3
    # The test has power: the draft's own distribution is rejected by it.
    assert chi_square_pvalue(samples, exact_first_two_token_distribution(draft, prompt, warpers)) < 1e-6


def test_sampling_is_reproducible_with_a_generator(small_vocab_pair):
    target, draft = small_vocab_pair
    prompt = torch.tensor([[1, 4, 2]])
    runs = [speculative_generate(target, draft, prompt, schedule="constant", max_new_tokens=30, do_sample=True,
                                 generator=torch.Generator().manual_seed(11)).sequences for _ in range(2)]
    assert torch.equal(*runs)


# -- bad input fails at once, clearly ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["jamba", "mamba"])
def test_models_whose_cache_cannot_roll_back_are_refused(tiny_pair, kind):
    """A recurrent layer cannot forget rejected tokens: refused as the draft and as the target,
    with a message naming the model, before anything is decoded."""
    target, draft = tiny_pair
    recurrent = tiny_recurrent(kind)
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=f"the draft \\({type(recurrent).__name__}\\) has recurrent layers"):
        speculative_generate(target, recurrent, prompt, schedule="constant", max_new_tokens=4)
    with pytest.raises(ValueError, match=f"the target \\({type(recurrent).__name__}\\) has recurrent layers"):
        speculative_generate(recurrent, None, prompt, schedule="none", max_new_tokens=4)


@pytest.mark.parametrize("change,error,message", [
    (dict(schedule="fastest"), ValueError, "unknown schedule"),
    (dict(stop_threshold=1.5), ValueError, "stop_threshold"),
    (dict(stop_threshold=-0.1), ValueError, "stop_threshold"),
    (dict(stop_threshold="high"), ValueError, "stop_threshold"),
    (dict(bound=(5, 2)), ValueError, "bound"),
    (dict(bound=(-1, 4)), ValueError, "bound"),
    (dict(schedule="ada", head=None), ValueError, "head"),
    (dict(schedule="ada", head=AcceptancePredictionHead(16, 1)), ValueError, "hidden size"),
    (dict(schedule="oracle", do_sample=True), ValueError, "greedy"),
    (dict(schedule="verify-budget", step_times=BUDGET_TIMES, do_sample=True), ValueError, "greedy decoding only"),
    (dict(schedule="verify-budget"), ValueError, "step_times=StepTimes"),
    (dict(schedule="ada-budget", step_times=BUDGET_TIMES), ValueError, "needs a proposer head"),
    (dict(schedule="ada-budget", head=None, step_times=BUDGET_TIMES), ValueError, "head"),
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens"),
    (dict(input_ids=torch.zeros(2, 3, dtype=torch.long)), ValueError, "batch size"),
    (dict(input_ids=[[1, 2, 3]]), TypeError, "input_ids"),
    (dict(input_ids=torch.zeros(1, 3)), TypeError, "integer"),
    (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), ValueError, "empty"),
    (dict(draft="other-vocab"), ValueError, r"vocabulary \(64\) and draft vocabulary \(80\) differ"),
    (dict(draft=None), ValueError, "draft"),
    (dict(num_assistant_tokens=0), ValueError, "num_assistant_tokens"),
    (dict(do_sample=True, temperature=0.0), ValueError, "temperature"),
])
def test_bad_input_fails_clearly(tiny_pair, change, error, message):
    target, draft = tiny_pair
    kwargs = dict(draft=draft, input_ids=torch.tensor([[1, 2, 3]]), schedule="constant", head=AcceptancePredictionHead(HIDDEN))
    kwargs.update(change)
    if kwargs["draft"] == "other-vocab":
        kwargs["draft"] = tiny_llama(vocab_size=80)
    with pytest.raises(error, match=message):
        speculative_generate(target, kwargs.pop("draft"), kwargs.pop("input_ids"), **kwargs)
