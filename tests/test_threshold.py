"""Choosing the stop threshold: the greedy replay is exact, the sampled one is the expectation over
p_acc, and the choice is stored and used."""
from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.calibration.report import main as calibration_main
from specdecpp.calibration.threshold import (ada_length, budget_length, choose_threshold, constant_length,
                                             dynamic_length, greedy_log_odds, marginal_scale, online_length,
                                             oracle_length, replay, replayed_rounds)
from specdecpp.costs import StepTimes, fit_verify_ms
from specdecpp.engine.online import OnlineAcceptanceEstimator, log_odds
from specdecpp.engine.settings import DecodingSettings
from specdecpp.head.inputs import predict

TIMES = StepTimes(draft_ms=[1.0] * 20, verify_ms=[10.0 + k for k in range(21)], target_alone_ms=10.0)
CORRECT = [np.array([1, 1, 0, 1, 1, 1, 0, 0], dtype=bool)]


def test_replay_by_hand():
    constant = replay(CORRECT, [None], constant_length(2), 20, TIMES)
    # rounds at 0 (2 drafted, 2 kept), 3 (2, 2), 6 (1 left to draft, 0 kept), 7 (nothing left to draft)
    assert (constant["target_calls"], constant["draft_calls"]) == (4, 5)
    assert constant["cost_per_token"] == pytest.approx(((12 + 2) + (12 + 2) + (11 + 1) + 10) / 8 / 10)
    oracle = replay(CORRECT, [None], oracle_length, 20, TIMES)
    assert (oracle["target_calls"], oracle["draft_calls"]) == (3, 5)
    predictions = [np.array([0.9, 0.9, 0.2, 0.9, 0.9, 0.9, 0.1, 0.5])]
    ada = replay(CORRECT, predictions, ada_length(0.5, 1), 20, TIMES)
    # round 0 stops after the 0.2 token (1 - 0.162 > 0.5); round 3 runs to the record's end
    assert (ada["target_calls"], ada["draft_calls"]) == (3, 7)


def test_the_cost_aware_rule_is_the_product_threshold_under_flat_step_times():
    rng = np.random.default_rng(0)
    accept = [rng.random(200) < 0.8 for _ in range(5)]
    predictions = [np.clip(a * 0.6 + rng.random(200) * 0.4, 0.01, 0.99) for a in accept]
    flat = StepTimes(draft_ms=[2.0] * 12, verify_ms=[10.0] * 13, target_alone_ms=10.0, judge_ms=0.3)
    assert marginal_scale(flat, 12) == [1.0] * 12
    for threshold in (0.2, 0.5, 0.8):
        product = replay(accept, predictions, ada_length(threshold, 1), 12, flat, judged=True)
        cost_aware = replay(accept, predictions, ada_length(threshold, 1, marginal_scale(flat, 12)), 12, flat, judged=True)
        assert cost_aware == product
    # A verification that grows with its length makes later tokens dearer: rounds stop sooner.
    growing = StepTimes(draft_ms=[2.0] * 12, verify_ms=[10.0 + 0.5 * k for k in range(13)], target_alone_ms=10.0)
    scale = marginal_scale(growing, 12)
    assert scale == pytest.approx([1.0] * 12)  # a straight line: the same extra cost for every token
    dearer_first = StepTimes(draft_ms=[4.0] + [2.0] * 11, verify_ms=[10.0 + 0.5 * k for k in range(13)],
                             target_alone_ms=10.0)
    assert marginal_scale(dearer_first, 3) == pytest.approx([1.0, 1.0, 1.0])  # the first step is never marginal
    cheaper_later = StepTimes(draft_ms=[4.0, 3.0, 2.0, 2.0], verify_ms=[10.0, 11.0, 12.0, 13.0, 14.0],
                              target_alone_ms=10.0)
    assert marginal_scale(cheaper_later, 3) == pytest.approx([4.0 / 4.0, 3.0 / 4.0, 3.0 / 4.0])
    longer = replay(accept, predictions, ada_length(0.5, 1, marginal_scale(cheaper_later, 12)), 12, cheaper_later)
    assert longer["draft_calls"] > replay(accept, predictions, ada_length(0.5, 1), 12, cheaper_later)["draft_calls"]


def test_replayed_time_is_the_sum_of_the_priced_steps():
    """Every part of a round is priced: the draft steps by their place in the round, the head's
    judgements, the verification by its length and the loop's own overhead."""
    times = StepTimes(draft_ms=[3.0, 2.0, 1.5], verify_ms=[10.0, 12.0, 13.0, 15.0], target_alone_ms=9.0,
                      judge_ms=0.25, round_overhead_ms=0.5)
    constant = replay(CORRECT, [None], constant_length(2), 20, times)
    # rounds of 2, 2, 1 and 0 drafted tokens (see test_replay_by_hand)
    rounds_ms = (13 + 3 + 2 + 0.5) + (13 + 3 + 2 + 0.5) + (12 + 3 + 0.5) + (10 + 0.5)
    assert rounds_ms == pytest.approx(sum(times.round_ms(k) for k in (2, 2, 1, 0)))
    assert constant["ms_per_token"] * 8 == pytest.approx(rounds_ms)
    assert constant["cost_per_token"] == pytest.approx(rounds_ms / 8 / 9.0)
    # a judged round adds its judgements; rounds past the measured lengths repeat the last step's price
    judged = replay(CORRECT, [np.full(8, 0.99)], constant_length(2), 20, times, judged=True)
    assert judged["ms_per_token"] * 8 == pytest.approx(rounds_ms + 5 * 0.25)
    assert times.round_ms(5) == pytest.approx(15.0 + 3 + 2 + 1.5 * 3 + 0.5)


def test_sampled_replay_is_the_expectation_over_acceptances():
    accept = [np.array([0.5, 0.5, 0.3])]
    constant = replay(accept, [None], constant_length(1), 20, TIMES)
    # a round at 0 always; at 1 when y_0 is rejected (0.5); at 2 unless y_0 is rejected and y_1 accepted (0.75)
    assert constant["target_calls"] == pytest.approx(1 + 0.5 + 0.75)
    assert constant["draft_calls"] == pytest.approx(1 + 0.5)
    assert constant["cost_per_token"] == pytest.approx((11 + 1 + 0.5 * (11 + 1) + 0.75 * 10) / 3 / 10)
    # against simulated rounds that accept each proposal with its p_acc
    rng = np.random.default_rng(0)
    accept, predictions = [rng.uniform(0.2, 1.0, 12)], [rng.uniform(0.3, 1.0, 12)]
    length = ada_length(0.6, 1)
    expected = replay(accept, predictions, length, 20, TIMES)
    calls = []
    for _ in range(20000):
        pos, target_calls = 0, 0
        while pos < 12:
            k = length(predictions[0], accept[0], pos, min(20, 12 - pos - 1))
            accepted = 0
            while accepted < k and rng.random() < accept[0][pos + accepted]:
                accepted += 1
            pos, target_calls = pos + accepted + 1, target_calls + 1
        calls.append(target_calls)
    assert np.mean(calls) == pytest.approx(expected["target_calls"], abs=4 * np.std(calls) / np.sqrt(len(calls)))


def greedy_records(target, draft, n: int, new_tokens: int) -> list[dict]:
    """Records as build-data makes them in greedy mode: the target's continuation, the draft's argmax
    after each target prefix, p_acc 1 where they agree."""
    generator = torch.Generator().manual_seed(5)
    records = []
    for i in range(n):
        prompt = torch.randint(4, 64, (1, 3 + i % 4), generator=generator)
        sequence = speculative_generate(target, None, prompt, schedule="none", max_new_tokens=new_tokens).sequences
        with torch.no_grad():
            log_q = draft(sequence).logits[0, prompt.shape[1] - 1: -1].log_softmax(-1)
        proposals = log_q.argmax(-1)
        tokens = sequence[0, prompt.shape[1]:]
        records.append({"prefix": prompt[0].tolist(), "tokens": tokens.tolist(), "draft": proposals.tolist(),
                        "p_acc": (proposals == tokens).double().tolist(),
                        "log_p_draft": log_q.gather(-1, proposals[:, None])[:, 0].tolist(),
                        "log_p_target": [0.0] * len(tokens)})
    return records


@pytest.fixture(scope="module")
def proposer_head():
    torch.manual_seed(2)
    head = AcceptancePredictionHead(32, 1, alignment="proposer", features=["log_q", "entropy"])
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    return head.double()


def test_replay_reproduces_the_engine_rounds(tiny_pair, proposer_head):
    """Each schedule's replayed rounds are the engine's, round by round: the same tokens accepted,
    and the same lengths for constant K and the oracle; for the rules that stop on what they judge
    (dynamic, ada, online) the same length up to the round's first rejected token, the tokens drafted
    after it judged by the engine from the draft's prefix and by the replay from the target's."""
    target, draft = tiny_pair
    records = greedy_records(target, draft, 4, 30)
    assert 0 < np.mean([p for r in records for p in r["p_acc"]]) < 1  # both accepts and rejects occur
    correct = [np.array(r["p_acc"]) == 1.0 for r in records]
    _, flat = predict(proposer_head, draft, records, batch_size=2)
    predictions = np.split(flat, np.cumsum([len(r["p_acc"]) for r in records])[:-1])
    draft_probs = [np.exp(r["log_p_draft"]) for r in records]
    cases = [("constant", constant_length(3), dict(num_assistant_tokens=3)),
             ("dynamic", dynamic_length(0.6), dict(num_assistant_tokens=20, assistant_confidence_threshold=0.6)),
             ("ada", ada_length(0.4, 1), dict(head=proposer_head, stop_threshold=0.4, bound=(1, 20))),
             ("ada", ada_length(0.7, 2), dict(head=proposer_head, stop_threshold=0.7, bound=(2, 20))),
             ("oracle", oracle_length, dict(bound=(2, 20)))]
    # The online rules learn over the records in order, in the replay as in the engine (refitting often here).
    learners = {"online": (OnlineAcceptanceEstimator(20, refit_interval=4), OnlineAcceptanceEstimator(20, refit_interval=4)),
                "ada-online": (OnlineAcceptanceEstimator.recalibration(20, refit_interval=4),
                               OnlineAcceptanceEstimator.recalibration(20, refit_interval=4))}
    cases += [("online", online_length(learners["online"][0], 0.5, 1),
               dict(stop_threshold=0.5, bound=(1, 20), estimator=learners["online"][1])),
              ("ada-online", online_length(learners["ada-online"][0], 0.5, 1),
               dict(head=proposer_head, online=True, stop_threshold=0.5, bound=(1, 20),
                    estimator=learners["ada-online"][1]))]
    values = {"dynamic": draft_probs, "online": [greedy_log_odds(r) for r in records],
              "ada-online": [np.array([log_odds(p) for p in values]) for values in predictions]}
    stopped_past_a_rejection = set()
    for schedule, length, settings in cases:
        rounds = list(replayed_rounds(correct, values.get(schedule, predictions), length, 20))
        schedule = schedule.removesuffix("-online")
        for index, r in enumerate(records):
            stats = speculative_generate(target, draft, torch.tensor([r["prefix"]]), schedule=schedule,
                                         max_new_tokens=len(r["tokens"]), **settings).stats
            own = [(pos, k) for record, pos, _, k, _ in rounds if record == index]
            drafted = [k for _, k in own]
            accepted = [oracle_length(None, correct[index], pos, k) for pos, k in own]
            assert accepted == stats.accepted_lengths, schedule
            if schedule in ("constant", "oracle"):
                assert drafted == stats.draft_lengths, schedule
            else:
                assert [min(k, a + 1) for k, a in zip(drafted, accepted)] \
                    == [min(k, a + 1) for k, a in zip(stats.draft_lengths, accepted)], schedule
                if any(k > a + 1 for k, a in zip(drafted, accepted)):
                    stopped_past_a_rejection.add(schedule)
    assert stopped_past_a_rejection  # rounds that drafted on past their first rejection occurred, and were allowed for
    # They learned the same labels (the features agree to rounding: the head's batched and per-step arithmetic).
    for replayed_estimator, engine_estimator in learners.values():
        assert replayed_estimator.refits == engine_estimator.refits > 3
        assert replayed_estimator.slope == pytest.approx(engine_estimator.slope, abs=1e-5)
        assert replayed_estimator.intercepts == pytest.approx(engine_estimator.intercepts, abs=1e-5)


def test_budget_rounds_verify_the_prefix_a_brute_force_search_chooses():
    """verify-budget and ada-budget: every round drafts the block and verifies the prefix whose
    expected tokens per round time is highest, as a search over every prefix length finds it."""
    times = StepTimes(draft_ms=[1.0, 0.8, 0.7, 0.6, 0.6, 0.6], verify_ms=[10, 11, 12.5, 14.5, 17, 20, 24],
                      target_alone_ms=10.0, judge_ms=0.1)
    rng = np.random.default_rng(3)
    accept, predictions = [rng.random(80) < 0.7], [rng.uniform(0.2, 1.0, 80)]
    replayed = replay(accept, predictions, budget_length(5, times, judged=True), 20, times, judged=True)
    pos, target_calls, draft_calls, total_ms, verified = 0, 0, 0, 0.0, []
    while pos < 80:
        drafted = min(5, 80 - pos - 1)
        survival = np.cumprod(predictions[0][pos:pos + drafted])
        rates = [(1 + survival[:n].sum()) / times.round_ms(drafted, drafted, n) for n in range(drafted + 1)]
        n = int(np.argmax(rates))
        accepted = oracle_length(None, accept[0], pos, n)
        total_ms += times.round_ms(drafted, drafted, n)
        target_calls, draft_calls, pos = target_calls + 1, draft_calls + drafted, pos + accepted + 1
        verified.append(n)
    assert (replayed["target_calls"], replayed["draft_calls"]) == (target_calls, draft_calls)
    assert replayed["ms_per_token"] * 80 == pytest.approx(total_ms)
    assert len(set(verified)) > 2  # the verified prefix really varied


def test_choose_threshold_stores_it_and_auto_uses_it(tiny_pair, proposer_head, pair_dirs, tmp_path):
    target, draft = tiny_pair
    records = greedy_records(target, draft, 3, 20)
    threshold, selection = choose_threshold(proposer_head, draft, target, records, bound=(1, 8), timing_repeats=3)
    assert threshold in selection["thresholds"]
    assert min(selection["cost_per_token"]) == selection["cost_per_token"][selection["thresholds"].index(threshold)]
    assert len(selection["step_times"]["verify_ms"]) == 9 and len(selection["judged_step_times"]["draft_ms"]) == 8
    assert selection["judged_step_times"]["judge_ms"] > 0 and selection["step_times"]["judge_ms"] == 0
    measured, fitted = selection["step_times"]["verify_ms_measured"], selection["step_times"]["verify_ms"]
    assert len(measured) == 9 and fitted == fit_verify_ms(measured)
    assert selection["oracle_cost_per_token"] <= min(selection["cost_per_token"])
    assert set(selection["dynamic_cost_per_token"]) == {"0.2", "0.3", "0.4", "0.5", "0.6"}
    assert list(selection["online_cost_per_token"]) == [f"{t:g}" for t in selection["thresholds"]]
    assert len(selection["ada_online_cost_per_token"]) == len(selection["thresholds"])
    assert set(selection["verify_budget_cost_per_token"]) == set(selection["ada_budget_cost_per_token"]) \
        == {"1", "2", "3", "4", "5", "6"}
    assert "online@0.5" in selection["calls_per_token"] and "verify-budget@K=3" in selection["calls_per_token"]

    head_dir, data = tmp_path / "head", tmp_path / "dev.jsonl"
    copy.deepcopy(proposer_head).float().save_pretrained(head_dir)
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    calibration_main(["--head", str(head_dir), "--draft", pair_dirs[1], "--target", pair_dirs[0],
                      "--data_path", str(data), "--choose_threshold", "--bound", "1", "8",
                      "--plot_path", str(tmp_path / "rel.png"), "--threshold_plot_path", str(tmp_path / "threshold.png"),
                      "--output", str(tmp_path / "report.json")])
    report = json.loads((tmp_path / "report.json").read_text())
    saved = AcceptancePredictionHead.from_pretrained(head_dir)
    assert saved.stop_threshold == report["threshold"]["stop_threshold"]
    assert saved.threshold_selection["data"] == str(data)
    assert f"Stored threshold: {saved.stop_threshold:g}" in (head_dir / "README.md").read_text()
    assert (tmp_path / "threshold.png").read_bytes()[:4] == b"\x89PNG"
    out = speculative_generate(target, draft, torch.tensor([records[0]["prefix"]]), schedule="ada",
                               head=saved.double(), stop_threshold="auto", max_new_tokens=20)
    assert out.sequences[0, len(records[0]["prefix"]):].tolist() == records[0]["tokens"]

    # Another head priced with the step times stored in the first: the same times, not new ones.
    other_dir = tmp_path / "other"
    copy.deepcopy(proposer_head).float().save_pretrained(other_dir)
    calibration_main(["--head", str(other_dir), "--draft", pair_dirs[1], "--target", pair_dirs[0],
                      "--data_path", str(data), "--choose_threshold", "--bound", "1", "8",
                      "--plot_path", str(tmp_path / "rel.png"), "--threshold_plot_path", str(tmp_path / "threshold.png"),
                      "--step_times_from", str(head_dir)])
    other = AcceptancePredictionHead.from_pretrained(other_dir).threshold_selection
    for key in ("step_times", "judged_step_times", "cost_per_token", "constant_k_cost_per_token"):
        assert other[key] == saved.threshold_selection[key], key
    assert saved.threshold_selection["step_times"]["threads"] == 1  # calibration's --threads default


def runs_of_eight(p_draft: float = 1.0) -> tuple[list[dict], np.ndarray]:
    """A greedy record of four runs of 8 accepted proposals, each followed by a rejected one, and a
    head's predictions over it (0.9 everywhere)."""
    p_acc = ([1.0] * 8 + [0.0]) * 4
    record = {"prefix": [1, 2], "tokens": [3] * len(p_acc), "p_acc": p_acc,
              "log_p_draft": [float(np.log(p_draft))] * len(p_acc)}
    return [record], np.full(len(p_acc), 0.9)


def test_a_replay_that_only_wrong_step_times_explain_is_refused(proposer_head):
    records, predictions = runs_of_eight()
    # the times: one length timed while the machine was busy, priced at 5x its neighbours
    busy = StepTimes(draft_ms=[1.0] * 8, verify_ms=[8.3, 14.4, 57.2, 11.6, 11.4, 12.0, 12.1, 12.2, 12.3],
                     target_alone_ms=8.3)
    with pytest.raises(ValueError, match=r"verification of K=2 drafted tokens at 57.20 ms, more than 3 target-alone "
                                         r"steps of 8.30 ms.*replayed: .*quieter machine, or pass --step_times_from"):
        choose_threshold(proposer_head, None, None, records, bound=(1, 8), predictions=predictions, times=(busy, busy))
    fitted = replace(busy, verify_ms=fit_verify_ms(busy.verify_ms))  # what StepProbe now prices rounds with
    _, selection = choose_threshold(proposer_head, None, None, records, bound=(1, 8), predictions=predictions,
                                    times=(fitted, fitted))
    assert selection["oracle_cost_per_token"] < min(selection["constant_k_cost_per_token"].values())

    # every verification sound against the target alone, but runs of 8 (the oracle's) priced at 8x those of 7
    slow_eight = replace(busy, verify_ms=[10.0] * 8 + [80.0], target_alone_ms=10.0)
    with pytest.raises(ValueError, match=r"the replayed oracle costs 0.978 target-alone steps per token, more than "
                                         r"K=4 \(0.308\).*step times are wrong.*--step_times_from"):
        choose_threshold(proposer_head, None, None, records, bound=(1, 8), predictions=predictions,
                         times=(slow_eight, slow_eight))
    # a draft step dearer than a verification: the oracle may lose to a rule that drafts less, and is not checked
    slow_draft = replace(slow_eight, draft_ms=[20.0] * 8)
    choose_threshold(proposer_head, None, None, records, bound=(1, 8), predictions=predictions,
                     times=(slow_draft, slow_draft))


def test_choosing_needs_a_proposer_head_and_replays_sampled_records_in_expectation(tiny_pair, proposer_head):
    target, draft = tiny_pair
    records = greedy_records(target, draft, 1, 5)
    with pytest.raises(ValueError, match="proposer"):
        choose_threshold(AcceptancePredictionHead(32, 1), draft, target, records)
    soft = [records[0] | {"p_acc": [0.5] * 5}]
    times = (TIMES, replace(TIMES, judge_ms=0.1))  # given: the modes are under test, not the timing
    threshold, selection = choose_threshold(proposer_head, draft, target, soft, bound=(1, 8), times=times)
    assert selection["mode"] == "sampling" and selection["oracle_cost_per_token"] is None
    assert selection["online_cost_per_token"] is None  # sampled records hold no draft top probability
    assert threshold in selection["thresholds"]
    _, greedy = choose_threshold(proposer_head, draft, target, records, bound=(1, 8), times=times)
    assert greedy["mode"] == "greedy" and greedy["oracle_cost_per_token"] is not None


def test_auto_warns_when_the_threshold_was_chosen_for_the_other_mode(tiny_pair, proposer_head):
    import warnings

    target, draft = tiny_pair
    head = copy.deepcopy(proposer_head).with_threshold(0.4, {"mode": "greedy"})
    prompt = torch.tensor([[5, 6, 7]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        speculative_generate(target, draft, prompt, head=head, stop_threshold="auto", max_new_tokens=4)
    with pytest.warns(UserWarning, match="for greedy decoding"):
        speculative_generate(target, draft, prompt, head=head, stop_threshold="auto", max_new_tokens=4,
                             do_sample=True, generator=torch.Generator().manual_seed(0))
    head.with_threshold(0.4, {"mode": "sampling"})
    assert head.threshold_mode == "sampling"


def test_the_selection_stores_the_records_processing_and_auto_warns_only_on_another(tiny_pair, proposer_head,
                                                                                      tmp_path):
    import warnings

    target, draft = tiny_pair
    penalty = DecodingSettings(repetition_penalty=1.2).processing_fields()
    records = [r | {"processing": penalty} for r in greedy_records(target, draft, 2, 12)]
    predictions = predict(proposer_head, draft, records)[1]
    with pytest.raises(ValueError, match="different logits processing"):
        choose_threshold(proposer_head, draft, target, records[:1] + [records[1] | {"processing": {}}], bound=(1, 8),
                         predictions=predictions, times=(TIMES, TIMES))
    threshold, selection = choose_threshold(proposer_head, draft, target, records, bound=(1, 8),
                                            predictions=predictions, times=(TIMES, TIMES))
    assert selection["processing"] == penalty
    copy.deepcopy(proposer_head).float().with_threshold(threshold, selection).save_pretrained(tmp_path / "head")
    head = AcceptancePredictionHead.from_pretrained(tmp_path / "head").double()
    assert head.threshold_processing == penalty  # the same shape DecodingSettings.processing_fields() returns
    assert "repetition_penalty=1.2" in (tmp_path / "head" / "README.md").read_text()
    prompt = torch.tensor([records[0]["prefix"]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        speculative_generate(target, draft, prompt, head=head, stop_threshold="auto", max_new_tokens=4,
                             repetition_penalty=1.2, step_times=TIMES)  # given: auto times nothing here
    with pytest.warns(UserWarning, match=r"for the processing \{'repetition_penalty': 1.2\}.*applies none"):
        speculative_generate(target, draft, prompt, head=head, stop_threshold="auto", max_new_tokens=4,
                             step_times=TIMES)
    with pytest.warns(UserWarning, match="applies {'repetition_penalty': 1.3}"):
        speculative_generate(target, draft, prompt, head=head, stop_threshold="auto", max_new_tokens=4,
                             repetition_penalty=1.3)
    # records from before records named their processing were built with none
    assert choose_threshold(proposer_head, draft, target, [{k: v for k, v in r.items() if k != "processing"}
                                                           for r in records], bound=(1, 8), predictions=predictions,
                            times=(TIMES, TIMES))[1]["processing"] == {}


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_auto_for_other_step_times_equals_the_full_replay(proposer_head, mode):
    """`head.threshold_for(times)` prices the rounds the calibration stored and chooses what a whole
    new replay at `times` chooses, for the CPU's prices, flat GPU-like prices and dear judgements."""
    rng = np.random.default_rng(0)
    p_acc = (rng.random(300) < 0.75).astype(float) if mode == "greedy" else rng.random(300)
    records = [{"prefix": [1, 2], "tokens": [3] * 100, "p_acc": list(p_acc[i:i + 100]),
                "log_p_draft": list(np.log(rng.uniform(0.2, 1.0, 100)))} for i in (0, 100, 200)]
    predictions = np.clip(p_acc + rng.normal(0, 0.2, 300), 0.01, 0.99)
    cpu = StepTimes(draft_ms=[1.0] * 8, verify_ms=[10.0 + 1.5 * k for k in range(9)], target_alone_ms=10.0,
                    judge_ms=0.3)
    _, stored = choose_threshold(proposer_head, None, None, records, bound=(1, 8), predictions=predictions,
                                 times=(cpu, cpu))
    head = copy.deepcopy(proposer_head).with_threshold(0.5, stored)
    chosen = set()
    for times in (cpu, replace(cpu, verify_ms=[10.0] * 9), replace(cpu, draft_ms=[3.0] * 8, judge_ms=1.0),
                  replace(cpu, draft_ms=[0.2] * 8, verify_ms=[1.0 + 0.01 * k for k in range(9)], target_alone_ms=1.0)):
        threshold, _ = choose_threshold(proposer_head, None, None, records, bound=(1, 8), predictions=predictions,
                                        times=(times, times))
        assert head.threshold_for(times) == threshold
        assert head.resolve_stop_threshold("auto", times) == threshold
        chosen.add(threshold)
    assert len(chosen) > 1  # the prices really moved the choice
    assert head.resolve_stop_threshold("auto") == 0.5
    with pytest.raises(ValueError, match="stores no replayed rounds"):
        copy.deepcopy(head).with_threshold(0.5, {k: v for k, v in stored.items() if k != "round_weights"}
                                           ).threshold_for(cpu)
