"""Logits processors and stopping criteria in the loop: greedy output identical to
`target.generate` with the same settings for every schedule, sampling distributed as the target's
processed distribution, clear refusals for what cannot apply per position."""
from __future__ import annotations

import itertools

import pytest
import torch
from test_compiled import needs_static_crop
from conftest import VOCAB
from test_custom_generate import HEAD_DIR, PROMPTS
from test_decoding import chi_square_pvalue, prompts, random_proposer, target_greedy, with_budget_knobs
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TopPLogitsWarper
from transformers.generation import WatermarkLogitsProcessor

from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.engine.schedules import SCHEDULES
from test_compiled import CHAIN_SCHEDULES


def settings_for(name: str, plain: list[int], eos: int) -> dict:
    """`generate` settings that change the greedy output of a prompt whose plain greedy
    continuation is `plain` (tokens taken from it, so that each setting acts)."""
    settings = {
        "repetition_penalty": {"repetition_penalty": 1.5},
        "no_repeat_ngram_size": {"no_repeat_ngram_size": 1},
        "min_new_tokens": {"min_new_tokens": 6},
        "min_length": {"min_length": 9},
        "bad_words_ids": {"bad_words_ids": [[plain[2]], [plain[0], plain[1]]]},
        "suppress_tokens": {"suppress_tokens": [t for t in (plain[2], plain[4]) if t != eos]},
        "begin_suppress_tokens": {"begin_suppress_tokens": [plain[0]]},
        "sequence_bias": {"sequence_bias": [[[plain[1]], -4.0], [[plain[2], plain[3]], 3.0]]},
        "forced_eos_token_id": {"forced_eos_token_id": eos},
        "max_time": {"max_time": 1e-9},
    }
    if name == "all":
        return {k: v for s in settings.values() for k, v in s.items() if k != "max_time"}
    return settings[name]


SETTINGS = ("repetition_penalty", "no_repeat_ngram_size", "min_new_tokens", "min_length", "bad_words_ids",
            "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "forced_eos_token_id", "max_time", "all")
LENGTHS = (3, 30)  # 3: the limit comes before the EOS (forced_eos_token_id acts); 30: the EOS comes first


# By default each setting runs with `ada` and each schedule with all settings; the other pairs are slow.
@pytest.mark.parametrize("schedule,name", [
    pytest.param(schedule, name, marks=() if schedule == "ada" or name == "all" else pytest.mark.slow)
    for schedule in SCHEDULES for name in SETTINGS])
def test_greedy_equals_target_generate_with_processing(tiny_pair, random_head, schedule, name):
    target, draft = tiny_pair
    for prompt, max_new_tokens in itertools.product(prompts(3, seed=1), LENGTHS):
        plain = target_greedy(target, prompt, 30)[0, prompt.shape[1]:].tolist()
        eos = plain[3]  # an EOS the plain output reaches early, inside a round
        settings = settings_for(name, plain, eos)
        expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                   max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos, **settings)
        out = speculative_generate(target, draft, prompt, schedule=schedule, eos_token_id=eos,
                                   max_new_tokens=max_new_tokens, num_assistant_tokens=4, bound=(2, 6), **settings,
                                   **with_budget_knobs(schedule, head=random_head))
        assert torch.equal(out.sequences, expected), (schedule, name, prompt, max_new_tokens)


def test_the_settings_change_the_output(tiny_pair):
    """The identity test has power: every setting changes some greedy output it compares."""
    target, _ = tiny_pair
    for name in SETTINGS:
        changed = False
        for prompt, max_new_tokens in itertools.product(prompts(3, seed=1), LENGTHS):
            plain = target_greedy(target, prompt, 30)[0, prompt.shape[1]:].tolist()
            runs = [target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=max_new_tokens, eos_token_id=plain[3], pad_token_id=plain[3],
                                    **settings)
                    for settings in ({}, settings_for(name, plain, plain[3]))]
            changed |= not torch.equal(*runs)
        assert changed, name


@pytest.fixture(scope="module")
def zoo_head():
    return AcceptancePredictionHead.from_pretrained(HEAD_DIR)


@pytest.fixture(scope="module")
def stop_string_cases(zoo):
    """(inputs, settings, stop string, target.generate's output) for each prompt, without and with a penalty: the
    stop is met at the 13th or 14th token."""
    target, _, tokenizer = zoo
    cases = []
    for prompt, settings in itertools.product(PROMPTS, ({}, {"repetition_penalty": 1.3})):
        inputs = tokenizer(prompt, return_tensors="pt")
        plain = target.generate(**inputs, max_new_tokens=40, do_sample=False, **settings)
        stop = tokenizer.decode(plain[0, inputs["input_ids"].shape[1] + 12:][:2])
        expected = target.generate(**inputs, max_new_tokens=40, do_sample=False, stop_strings=[stop],
                                   tokenizer=tokenizer, **settings)
        assert expected.shape[1] < plain.shape[1]
        cases.append((inputs, settings, stop, expected))
    return cases


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stop_strings_and_a_repetition_penalty_on_the_zoo_pair(zoo, zoo_head, stop_string_cases, schedule):
    """Stop strings need a real tokenizer: the zoo pair's. The stop is met inside a round, and
    nothing past it comes out; with a penalty on top, as `generate` does both."""
    target, draft, tokenizer = zoo
    for inputs, settings, stop, expected in stop_string_cases:
        out = speculative_generate(target, draft, **inputs, schedule=schedule, head=zoo_head, max_new_tokens=40,
                                   bound=(1, 8), stop_strings=[stop], tokenizer=tokenizer, **settings)
        assert torch.equal(out.sequences, expected), (schedule, inputs["input_ids"], settings)


def exact_processed_distribution(target, prompt, processors) -> torch.Tensor:
    """P(x1, x2) under the target with `processors` applied at each position with its prefix."""
    with torch.no_grad():
        p1 = processors(prompt, target(prompt).logits[:, -1].float()).softmax(-1)[0]
        rows = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
        logits = target(rows).logits[:, -1].float()
        p2 = torch.cat([processors(rows[i:i + 1], logits[i:i + 1]) for i in range(VOCAB)]).softmax(-1)
    return (p1[:, None] * p2).reshape(-1)


@pytest.mark.parametrize("schedule", ["ada", pytest.param("constant", marks=pytest.mark.slow)])
def test_sampling_follows_the_processed_target_distribution(small_vocab_pair, random_head, schedule):
    target, draft = small_vocab_pair
    prompt = torch.tensor([[1, 4, 2]])
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(1000):
        out = speculative_generate(target, draft, prompt, schedule=schedule, head=random_head, bound=(1, 4),
                                   num_assistant_tokens=3, max_new_tokens=2, do_sample=True, generator=generator,
                                   repetition_penalty=3.0, top_p=0.8)
        samples.append(tuple(out.sequences[0, 3:5].tolist()))
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0), TopPLogitsWarper(0.8)])
    assert chi_square_pvalue(samples, exact_processed_distribution(target, prompt, processors)) > 1e-3
    # The test has power: the target's distribution without the penalty is rejected by it.
    without = LogitsProcessorList([TopPLogitsWarper(0.8)])
    assert chi_square_pvalue(samples, exact_processed_distribution(target, prompt, without)) < 1e-6


def test_a_processor_that_cannot_apply_per_position_is_refused(tiny_pair):
    target, draft = tiny_pair
    watermark = LogitsProcessorList([WatermarkLogitsProcessor(vocab_size=64, device="cpu")])
    with pytest.raises(ValueError, match="WatermarkLogitsProcessor cannot be applied"):
        speculative_generate(target, draft, torch.tensor([[1, 2]]), logits_processor=watermark)


def test_stop_strings_need_the_tokenizer(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match="tokenizer"):
        speculative_generate(target, draft, torch.tensor([[1, 2]]), stop_strings=["the"])


@pytest.mark.parametrize("names", [pytest.param(("repetition_penalty",), marks=pytest.mark.slow), ("all",)])
@pytest.mark.parametrize("schedule", CHAIN_SCHEDULES)
@needs_static_crop
def test_compiled_greedy_equals_target_generate_with_processing(tiny_pair, random_head, schedule, names):
    """The compiled engine under processors that read the prefix (its draft's graph is then the
    forward alone): still `target.generate`'s output, EOS and the length limit inside a round, with
    a reader head and with a proposer head of three features."""
    target, draft = tiny_pair
    head = random_head if names == ("repetition_penalty",) else random_proposer(features=("log_q", "entropy", "margin"))
    for name, prompt, max_new_tokens in itertools.product(names, prompts(3, seed=1), LENGTHS):
        plain = target_greedy(target, prompt, 30)[0, prompt.shape[1]:].tolist()
        settings = settings_for(name, plain, plain[3])
        expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                   max_new_tokens=max_new_tokens, eos_token_id=plain[3], pad_token_id=plain[3],
                                   **settings)
        out = speculative_generate(target, draft, prompt, schedule=schedule, eos_token_id=plain[3],
                                   max_new_tokens=max_new_tokens, num_assistant_tokens=4, bound=(2, 6), compile=True,
                                   **settings, **with_budget_knobs(schedule, head=head))
        assert torch.equal(out.sequences, expected), (schedule, name, prompt, max_new_tokens)


@pytest.mark.slow  # a chi-square through compiled graphs; the eager one runs by default
@needs_static_crop
def test_compiled_sampling_follows_the_processed_target_distribution(small_vocab_pair, random_head):
    target, draft = small_vocab_pair
    prompt = torch.tensor([[1, 4, 2]])
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(1000):
        out = speculative_generate(target, draft, prompt, schedule="ada", head=random_head, bound=(1, 4),
                                   max_new_tokens=2, do_sample=True, generator=generator, repetition_penalty=3.0,
                                   top_p=0.8, compile=True)
        samples.append(tuple(out.sequences[0, 3:5].tolist()))
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0), TopPLogitsWarper(0.8)])
    assert chi_square_pvalue(samples, exact_processed_distribution(target, prompt, processors)) > 1e-3
    without = LogitsProcessorList([TopPLogitsWarper(0.8)])
    assert chi_square_pvalue(samples, exact_processed_distribution(target, prompt, without)) < 1e-6
