"""The plugin's work apart from vLLM (`specdecpp.serving.vllm`): one head forward over a batch's
draft step stops a row alone where the eager engine's per-token judgement (`schedules.Ada`) stops it,
a batch once one more forward is not worth its price, and the `additional_config` section's
settings and errors. tests/test_serving_vllm_draft.py runs the plugin inside vLLM."""
from __future__ import annotations

import collections
import subprocess
import sys
from dataclasses import fields

import pytest
import torch

from specdecpp import AcceptancePredictionHead
from specdecpp.engine.draft_step import DraftStep
from specdecpp.engine.schedules import make_schedule
from specdecpp.head.model import LeanJudge
from specdecpp.engine.settings import DecodingSettings
from specdecpp.costs import StepTimes
from specdecpp.serving.vllm import (ACCEPTANCE_MEMORY, FIELDS, SERVED_FROM, SERVED_ROUNDS, BatchRound, ServedAcceptance, ServedCosts, StopDrafting,
                                    VllmPrices, section_settings)

HIDDEN, VOCAB, ROWS = 16, 40, 6


def random_head(alignment: str = "proposer", features=("log_q", "entropy", "margin"), threshold: float | None = 0.4):
    torch.manual_seed(0)
    head = AcceptancePredictionHead(HIDDEN, num_layers=2, alignment=alignment, features=list(features))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.5)
    if threshold is not None:
        head.with_threshold(threshold, {})
    return head


def draft_steps(count: int, seed: int = 1):
    """`count` draft steps of a batch: hidden states, raw logits and the argmax tokens."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        hidden = torch.randn(ROWS, HIDDEN, generator=generator)
        logits = 3 * torch.randn(ROWS, VOCAB, generator=generator)
        yield hidden, logits, logits.argmax(-1)


def eager_rounds(settings: DecodingSettings, steps: list, max_draft: int) -> tuple[list[int], list[list[float]]]:
    """Each row's round length as the eager engine judges it, token by token (`LeanJudge` then `Ada.stop_after` on
    the step's hidden state, logits and softmax), and its P(accept) at every step."""
    lengths, p_accept, judge = [], [], LeanJudge(settings.head)
    for row in range(ROWS):
        schedule, row_p, length = make_schedule(settings), [], None
        schedule.start_round()
        for j, (hidden, logits, tokens) in enumerate(steps, start=1):
            probs = logits[row].softmax(-1)
            row_p.append(float(judge(hidden[row], logits[row], tokens[row], probs)))
            step = DraftStep(num_drafted=j, token_prob=0.0, hidden=hidden[row], token=int(tokens[row]),
                             logits=logits[row], probs=probs, accept_prob=row_p[-1])
            if length is None and (schedule.stop_after(step) or j == max_draft):
                length = j
        lengths.append(length or len(steps))
        p_accept.append(row_p)
    return lengths, p_accept


def batch_lengths(settings: DecodingSettings, steps: list, max_draft: int, rows: int = ROWS
                  ) -> tuple[list[int], BatchRound]:
    schedules = [make_schedule(settings) for _ in range(rows)]
    batch = BatchRound(LeanJudge(settings.head), schedules, max_draft)
    with pytest.raises(StopDrafting):
        for hidden, logits, tokens in steps:
            batch.step(hidden[:rows], logits[:rows], tokens[:rows], None)
    return [len(p) for p in batch.proposals()], batch


@pytest.mark.parametrize("alignment, features", [("proposer", ("log_q", "entropy", "margin")), ("proposer", ()),
                                                 ("reader", ())])
def test_a_row_alone_stops_as_the_eager_judgement(alignment, features):
    settings = DecodingSettings(schedule="ada", head=random_head(alignment, features), stop_threshold="auto",
                                bound=(1, 20))
    steps = list(draft_steps(12))
    lengths, _ = eager_rounds(settings, steps, 12)
    assert len(set(lengths)) > 1  # the rows stop apart
    for row in range(ROWS):
        alone = [(hidden[row:row + 1], logits[row:row + 1], tokens[row:row + 1]) for hidden, logits, tokens in steps]
        (length,), batch = batch_lengths(settings, alone, 12, rows=1)
        assert length == lengths[row] == len(batch.tokens)
        assert batch.proposals() == [[int(tokens[row]) for _, _, tokens in steps[:length]]]


class Judgements:
    """A stand-in for the head: step `j` judges row `r` `p_accept[r][j - 1]`."""

    def __init__(self, p_accept: list[list[float]]):
        self.p_accept, self.steps = p_accept, 0

    def __call__(self, hidden, logits, tokens):
        self.steps += 1
        return torch.tensor([row[self.steps - 1] for row in self.p_accept])


def priced_round(p_accept, threshold: float, prices: VllmPrices, bound=(1, 20), max_draft: int = 12) -> BatchRound:
    settings = DecodingSettings(schedule="ada", head=random_head(threshold=threshold), stop_threshold="auto",
                                bound=bound)
    batch = BatchRound(LeanJudge(settings.head), [make_schedule(settings) for _ in p_accept], max_draft, prices)
    batch.judge = Judgements(p_accept)
    return batch


def run_round(batch: BatchRound, rows: int, checkpoints: dict | None = None) -> BatchRound:
    """Step `batch` until it stops; `checkpoints[j]` gets its expected tokens and price after step j."""
    with pytest.raises(StopDrafting):
        for j, (hidden, logits, tokens) in enumerate(draft_steps(12), start=1):
            if checkpoints is not None:
                checkpoints[j] = None  # stopped at this step unless it carries on
            batch.step(hidden[:rows], logits[:rows], tokens[:rows], None)
            if checkpoints is not None:
                tokens_drafted = sum(length or j for length in batch.lengths)
                checkpoints[j] = (batch.expected_tokens(), batch.price_ms(j, tokens_drafted))
    return batch


def flat_prices(rows: int) -> VllmPrices:
    """A draft forward 2 ms; verifying k drafted tokens of every row 10 + 2k ms."""
    return VllmPrices({rows: StepTimes(draft_ms=[2.0] * 12, verify_ms=[10.0 + 2 * k for k in range(13)],
                                       target_alone_ms=10.0)}, 12)


def test_the_batch_drafts_while_a_forward_is_worth_its_price():
    # Two rows judged 0.9 and 0.5 at every step; their own rules never stop them (threshold 1). One more forward
    # adds each drafting row's next survival, estimated with its last judgement.
    # After step 1: expected (1 + .9) + (1 + .5) = 3.4 in verify(1) + 1 forward = 14 ms (0.2429/ms); one more adds
    # .9 x .9 + .5 x .5 = 1.06 for verify(2) + 2 forwards = 18 ms: 4.46 / 18 = 0.2478/ms, worth it.
    # After step 2: 4.46 in 18 ms (0.2478/ms); one more: (4.46 + .729 + .125) / 22 = 0.2415/ms: the batch stops.
    checkpoints = {}
    batch = run_round(priced_round([[0.9] * 12, [0.5] * 12], 1.0, flat_prices(2)), 2, checkpoints)
    assert [len(p) for p in batch.proposals()] == [2, 2]
    assert checkpoints[1] == pytest.approx((3.4, 14.0))
    assert checkpoints[2] is None  # it stopped there: its figures, by hand, were
    assert batch.expected_tokens() == pytest.approx(4.46) and batch.price_ms(2, 4) == pytest.approx(18.0)
    assert batch.price_ms(3, 5) == pytest.approx(21.0)  # 5 tokens over 2 rows: half way from verify(2) to verify(3)


def test_the_batch_prices_at_the_costs_it_was_served_at():
    # As served, a forward after the first costs 3x its price: after step 1 (3.4 in 14 ms: 0.2429/ms), one more
    # forward adds 1.06 for verify(2) + the first forward (16 ms) + one more at 3 x 2 ms = 22 ms: 0.2027/ms.
    served = ServedCosts(forwards={2: 3.0}, rest={2: 1.0})
    batch = priced_round([[0.9] * 12, [0.5] * 12], 1.0, flat_prices(2))
    batch.served = served
    assert [len(p) for p in run_round(batch, 2).proposals()] == [1, 1]
    served.rest[2] = 2.0  # 3 tokens a row: (verify 16 + first forward 2) x 2 + 2 more forwards x 2 ms x 3
    assert batch.price_ms(3, 6) == pytest.approx(36.0 + 12.0)


def test_the_batch_and_its_rows_draft_while_a_token_beats_the_rate_its_size_was_served_at():
    # The rows of the first test, its prices, now against the expected tokens per ms this batch size's rounds served,
    # `r`. One more token costs 1 ms (2 ms a token a row over 2 rows), one more forward 2 ms. A row keeps a token
    # (after the bound's first) whose survival beats r x 1 ms; the batch drafts a forward while its rows' next
    # tokens add more than that, in all, than r x 2 ms. At r = .3: after step 1 the next tokens add (.81 - .3) + 0
    # = .51 < .6, and the batch stops. At r = .2: they add .61 + .05 = .66 > .4; after step 2, .529 + 0 > .4; at
    # step 3 the second row's token (.125 < .2) is dropped, and the first's next adds .4561 > .4; after step 4 it
    # adds .39049 < .4 and the batch stops. The rows' own rules (threshold 1) never stop them.
    def lengths(rate: float) -> list[int]:
        batch = priced_round([[0.9] * 12, [0.5] * 12], 1.0, flat_prices(2))
        batch.served = ServedCosts(rounds={2: collections.deque([(10 * rate, 10.0)] * SERVED_FROM)})
        return [len(p) for p in run_round(batch, 2).proposals()]

    assert lengths(0.3) == [1, 1] and lengths(0.2) == [4, 2]


def test_the_batch_leaves_a_forward_fewer_than_its_quorum_of_rows_would_draft_to_the_next_round():
    # Four rows at the rate r = .2 served, the first test's prices over 4 rows: one more token costs .5 ms, one more
    # forward 2 ms. Rows judged .3 keep no second token (survival .09 < r x .5); rows judged .99 keep every one, and
    # each adds .99^k - .1 > r x 2 ms. With one such row of four drafting (below the quorum of half), the batch
    # stops at the second forward; with two, it drafts on to `max_draft`.
    def lengths(confident: int) -> list[int]:
        p_accept = [[0.99] * 12] * confident + [[0.3] * 12] * (4 - confident)
        batch = priced_round(p_accept, 1.0, flat_prices(4))
        batch.served = ServedCosts(rounds={4: collections.deque([(2.0, 10.0)] * SERVED_FROM)})
        return [len(p) for p in run_round(batch, 4).proposals()]

    assert lengths(1) == [2, 1, 1, 1] and lengths(2) == [12, 12, 1, 1]


def test_the_served_rate_is_the_expected_tokens_over_the_price_of_a_sizes_last_rounds():
    served = ServedCosts()

    def served_round(p_accept: list[list[float]]) -> list[int]:
        batch = priced_round(p_accept, 1.0, flat_prices(len(p_accept)))
        batch.served = served
        run_round(batch, len(p_accept))
        # Served at its prices: the verification before it and its forwards take what they are priced at.
        start = 0.0 if served.last is None else served.last[2] + (served.last[1] + 2.0) / 1000
        batch.marks = [start + 0.002 * i for i in range(len(batch.marks))]
        served.observe(batch, ended=batch.marks[-1])
        return [len(p) for p in batch.proposals()]

    for _ in range(SERVED_FROM - 1):  # against the round so far: 4.46 expected tokens in 18 ms
        assert served_round([[0.9] * 12, [0.5] * 12]) == [2, 2]
    assert served.rate(2) is None
    served_round([[0.9] * 12, [0.5] * 12])
    assert served.rate(2) == pytest.approx(4.46 / 18)
    # Against that rate (then less), a forward adds 2 x (.25 - r) of the 2r it must: 3 tokens in 14 ms, but for the
    # round that samples the forwards again (SERVED_ROUNDS // 2 rounds on): its second tokens beat r x 1 ms, 3.5 in 18.
    lengths = [served_round([[0.5] * 12, [0.5] * 12]) for _ in range(SERVED_ROUNDS)]
    assert lengths.count([2, 2]) == 1 and lengths.count([1, 1]) == SERVED_ROUNDS - 1
    assert served.rate(2) == pytest.approx((3 * (SERVED_ROUNDS - 1) + 3.5) / (14 * (SERVED_ROUNDS - 1) + 18))
    for _ in range(SERVED_FROM):
        served_round([[0.9] * 12])
    assert 1 not in served.rounds  # a row alone stops on its own rule: its rounds set no rate


def test_a_batch_size_yet_to_serve_takes_the_rate_of_the_sizes_around_it():
    def rounds(rate: float, count: int = SERVED_FROM) -> collections.deque:
        return collections.deque([(10 * rate, 10.0)] * count)

    served = ServedCosts(rounds={4: rounds(0.2), 16: rounds(0.5), 8: rounds(9.0, SERVED_FROM - 1)})
    assert served.rated == [4, 16]  # 8 has yet to serve SERVED_FROM rounds
    assert served.rate(4) == pytest.approx(0.2) and served.rate(16) == pytest.approx(0.5)
    assert served.rate(8) == pytest.approx(0.2 + 0.3 * 4 / 12)  # linear in rows between 4 and 16
    assert served.rate(2) == pytest.approx(0.2) and served.rate(32) == pytest.approx(0.5)  # beyond: the nearest's
    assert ServedCosts(rounds={8: rounds(9.0, SERVED_FROM - 1)}).rate(8) is None  # no size has served
    batch = priced_round([[0.9] * 12] * 2, 1.0, flat_prices(2))
    batch.served = served
    run_round(batch, 2)
    prices = [served.observe(batch, ended=batch.marks[-1])]
    assert served.rated == [4, 16] and len(served.rounds[2]) == 1
    prices += [served.observe(batch, ended=batch.marks[-1]) for _ in range(SERVED_FROM - 1)]
    assert served.rated == [2, 4, 16]  # once it served SERVED_FROM rounds, a size's rate is its own
    assert served.rate(2) == pytest.approx(SERVED_FROM * batch.expected_tokens() / sum(prices))


def test_prices_between_timed_batch_sizes_are_linear_in_rows():
    def timed(ms: float) -> StepTimes:
        return StepTimes(draft_ms=[ms] * 2, verify_ms=[10 * ms, 12 * ms, 14 * ms], target_alone_ms=10 * ms,
                         round_overhead_ms=ms)

    prices = VllmPrices({1: timed(1.0), 4: timed(2.0), 16: timed(5.0)}, 2)
    assert prices.at(4) is prices.times[4] and prices.at(32) is prices.times[16]  # timed, and beyond: the nearest
    halfway = prices.at(10)  # from 4 to 16
    assert halfway.draft_ms == pytest.approx([3.5, 3.5]) and halfway.verify_ms == pytest.approx([35.0, 42.0, 49.0])
    assert halfway.target_alone_ms == pytest.approx(35.0) and halfway.round_overhead_ms == pytest.approx(3.5)
    assert halfway.drafting_ms(2) == pytest.approx(7.0) and prices.at(10) is halfway
    assert prices.at(2).verify_ms == pytest.approx([40 / 3, 16.0, 56 / 3])  # a third of the way from 1 to 4


def test_the_batch_expects_the_survival_vllm_accepted():
    # vLLM accepted every first token the head expected (ratio (1 + 1) / (1 + 1) at depth 1) and half as many second
    # ones ((.5 + 1) / (2 + 1)). After step 1: 3.4 in 14 ms (0.2429/ms) as before; one more forward now adds
    # (.81 + .25) x .5 = .53 for 18 ms: 3.93 / 18 = 0.2183/ms, and the batch stops (at its prices alone it drafts 2).
    batch = priced_round([[0.9] * 12, [0.5] * 12], 1.0, flat_prices(2))
    batch.acceptance = ServedAcceptance(expected=[1.0, 2.0], accepted=[1.0, 0.5])
    assert [len(p) for p in run_round(batch, 2).proposals()] == [1, 1]
    assert batch.expected_tokens() == pytest.approx(3.4)
    # Where vLLM accepted more than expected, a token's survival as served stays a probability: (3 + 1) / (.2 + 1)
    # times .9 and .5 is 3 and 1.67, each served as 1.
    batch = priced_round([[0.9] * 12, [0.5] * 12], 1.0, flat_prices(2))
    batch.acceptance = ServedAcceptance(expected=[0.2], accepted=[3.0])
    batch.step(*[x[:2] for x in next(draft_steps(1))], None)  # a second token served as sure: it drafts on
    assert batch.expected_tokens() == pytest.approx(2 + 1 + 1)


def test_the_batch_forecasts_a_rows_next_token_as_the_head_judged_such_tokens():
    # The first test's batch, where the head judged second tokens at 2/3 of their forecast ((1 + 1) / (2 + 1)): after
    # step 1 one more forward now adds (.81 + .25) x 2/3 = .7067 for 18 ms: 4.1067 / 18 = 0.2281/ms < 0.2429/ms.
    batch = priced_round([[0.9] * 12, [0.5] * 12], 1.0, flat_prices(2))
    batch.acceptance = ServedAcceptance(forecast=[0.0, 2.0], judged=[0.0, 1.0])
    assert [len(p) for p in run_round(batch, 2).proposals()] == [1, 1]
    # Each drafting row's token after its first is set against its forecast, its last judgement again: at step 2 the
    # first row's .9 x .6 = .54 against .81, the second's .25 against .25. Then 4.19 in 18 ms (0.2328/ms), and a third
    # forward would add (.54 x .6 + .25 x .5) x 1.79 / 2.06 = .39 for 22 ms (0.2082/ms): the batch stops.
    batch = priced_round([[0.9, 0.6, 0.6], [0.5, 0.5, 0.5]], 1.0, flat_prices(2))
    run_round(batch, 2)
    assert [len(p) for p in batch.proposals()] == [2, 2]
    assert batch.acceptance.forecast == pytest.approx([0.0, 0.81 + 0.25])
    assert batch.acceptance.judged == pytest.approx([0.0, 0.54 + 0.25])
    assert batch.acceptance.next_ratio(2) == pytest.approx(1.79 / 2.06)
    assert batch.acceptance.next_ratio(7) == batch.acceptance.next_ratio(2)  # the deepest beyond
    assert ServedAcceptance().next_ratio(3) == 1.0  # 1 until seen


def test_served_acceptance_reads_each_verified_proposal_by_request():
    acceptance = ServedAcceptance()
    acceptance.proposed(["a", "b", "c", "d"], [[0.9, 0.8, 0.6], [0.5], [0.7, 0.7], []])
    # In the next step's batch order: b rejected its token, a accepted 2 of 3, c had only 1 of its 2 verified (not
    # read), e is new.
    acceptance.verified(["b", "a", "c", "e"], [1, 3, 1, 0], [1, 1, 0, 0])
    assert acceptance.expected == pytest.approx([1.4, 0.8, 0.6]) and acceptance.accepted == [1.0, 1.0, 0.0]
    assert acceptance.accepted_tokens == 2 and acceptance.pending == {}
    assert acceptance.ratio(1) == pytest.approx(2 / 2.4)
    assert acceptance.ratio(3) == acceptance.ratio(7) == pytest.approx(1 / 1.6)  # the deepest beyond
    acceptance.verified(["a"], [3], [0])  # nothing proposed since: nothing read
    assert acceptance.accepted_tokens == 2
    acceptance.proposed(["a"], [[0.5]])
    acceptance.verified(["a"], [1], [0])  # the sums so far decay once per verification read
    decay = 1 - 1 / ACCEPTANCE_MEMORY
    assert acceptance.expected == pytest.approx([1.4 * decay + 0.5, 0.8 * decay, 0.6 * decay])
    assert acceptance.accepted == pytest.approx([decay + 1, decay, 0.0]) and acceptance.accepted_tokens == 3


def test_served_costs_are_medians_of_measured_over_priced():
    prices, served = flat_prices(2), ServedCosts()

    def observe(lengths, start: float, forwards_ms: float = 0.0) -> None:
        batch = priced_round([[0.9] * 12, [0.5] * 12], 1.0, prices)
        batch.lengths, batch.stopped_tokens, steps = lengths, sum(lengths), max(lengths)  # a stopped round
        # its forwards after the first take `forwards_ms` in all
        batch.marks = [start + forwards_ms / 1000 * i / max(steps - 1, 1) for i in range(steps)]
        served.observe(batch, ended=batch.marks[-1] + 0.001)

    observe([3, 2], 10.0, forwards_ms=30)  # forwards 2 and 3 priced 4 ms: a slow first round at this batch size
    for _ in range(2):  # 5 tokens over 2 rows verified (priced 10 + 2 x 2.5), then the first forward (2): 34 ms
        observe([3, 2], served.last[2] + 0.034, forwards_ms=6)
    assert served.forwards == {} and served.rest == {}  # three rounds: none scales a price yet
    observe([3, 2], served.last[2] + 0.034, forwards_ms=6)
    assert served.forwards == {2: pytest.approx(1.5)} and served.rest == {}  # the median of 7.5, 1.5, 1.5, 1.5
    observe([1, 1], served.last[2] + 0.034)  # the fourth verification
    assert served.rest == {2: pytest.approx(2.0)}
    for gap in (0.5, 0.0, 0.0):  # an engine idle half a second between two rounds, then two at 28 ms, priced 14
        observe([1, 1], served.last[2] + 0.028 + gap)
    assert served.rest == {2: pytest.approx(2.0)}  # the median of 2, 2, 2, 2, 37.7, 2, 2: the idle gap goes unheard
    third = priced_round([[0.9] * 12], 1.0, VllmPrices({1: prices.times[2]}, 12))
    third.lengths, third.stopped_tokens, third.marks = [1], 1, [served.last[2] + 0.1]
    served.observe(third, ended=third.marks[0] + 0.1)  # one row now: not set against two rows' verification
    assert set(served.rest) == {2}


def test_a_stale_forward_price_cannot_hold_the_batch_to_one_forward():
    served = ServedCosts(forwards={2: 100.0})  # a forward after the first priced 100x: never worth it

    def served_round() -> list[int]:
        batch = priced_round([[0.9] * 12, [0.5] * 12], 1.0, flat_prices(2))
        batch.served = served
        run_round(batch, 2)
        served.observe(batch, ended=batch.marks[-1])
        return [len(p) for p in batch.proposals()]

    half = SERVED_ROUNDS // 2
    lengths = [served_round() for _ in range(half + 2)]
    assert lengths[:half] == [[1, 1]] * half
    assert lengths[half:] == [[2, 2], [1, 1]]  # one round samples the forwards, then the price holds again
    assert served.forwards == {2: 100.0}  # one sample scales no price


def test_each_row_still_stops_on_its_own_rule_and_a_row_alone_ignores_prices():
    # The second row's own rule (threshold 0.6) stops it after 1 token (1 - .3 = .7). The first drafts on while its
    # forward is worth it: after step 1, 3.2 in verify(1) + 1 forward = 14 ms (0.2286/ms), one more adds .81 for
    # 17 ms (3 tokens: verify 13 ms): 0.2359/ms; after step 2, one more adds .729 for 20 ms: 0.2370/ms; after step
    # 3, 4.739 in 20 ms (0.2370/ms), one more adds .6561 for 23 ms: 0.2346/ms, and the batch stops.
    batch = run_round(priced_round([[0.9] * 12, [0.3] * 12], 0.6, flat_prices(2)), 2)
    assert [len(p) for p in batch.proposals()] == [3, 1]
    # Alone, the row's own rule: 1 - .9^9 = .61 > .6, where those prices would have stopped a batch after 3.
    alone = run_round(priced_round([[0.9] * 12], 0.6, flat_prices(1)), 1)
    assert len(alone.proposals()[0]) == 9


def test_a_row_stops_at_its_room_and_a_row_without_room_proposes_nothing():
    # Rows judged 0.9 at every step, their rules never stopping them (threshold 1), no prices (the batch drafts while
    # any row does): rooms of 2, 0 and 12 tokens. The batch expects each row's token after its proposal (3) and the
    # survival of each token proposed: .9 + .81 for the first row, none for the second, .9 + ... + .9^12 for the last.
    batch = priced_round([[0.9] * 12] * 3, 1.0, None)
    batch.rooms = [2, 0, 12]
    run_round(batch, 3)
    assert [len(p) for p in batch.proposals()] == [2, 0, 12]
    assert batch.expected_tokens() == pytest.approx(3 + 0.9 + 0.81 + sum(0.9 ** d for d in range(1, 13)))
    assert [len(s) for s in batch.survival] == [2, 0, 12]


def test_rounds_stop_at_max_draft_and_keep_the_bounds_minimum():
    settings = DecodingSettings(schedule="ada", head=random_head(threshold=0.0), stop_threshold="auto", bound=(3, 20))
    lengths, _ = batch_lengths(settings, list(draft_steps(12)), 12)
    assert lengths == [3] * ROWS  # a threshold of 0 stops as soon as the bound allows
    settings = DecodingSettings(schedule="ada", head=random_head(), stop_threshold=1.0, bound=(1, 20))
    lengths, _ = batch_lengths(settings, list(draft_steps(12)), 5)
    assert lengths == [5] * ROWS  # a threshold of 1 never stops: K


def test_schedules_start_each_round_afresh():
    settings = DecodingSettings(schedule="ada", head=random_head(), stop_threshold="auto", bound=(1, 20))
    schedules = [make_schedule(settings) for _ in range(ROWS)]
    steps = list(draft_steps(12))
    first, second = BatchRound(LeanJudge(settings.head), schedules, 12), BatchRound(LeanJudge(settings.head), schedules, 12)
    for batch in (first, second):
        with pytest.raises(StopDrafting):
            for hidden, logits, tokens in steps:
                batch.step(hidden, logits, tokens, None)
    assert first.proposals() == second.proposals()


def test_sampled_steps_keep_their_draft_probabilities():
    settings = DecodingSettings(schedule="ada", head=random_head(), stop_threshold="auto", bound=(1, 20))
    batch = BatchRound(LeanJudge(settings.head), [make_schedule(settings) for _ in range(ROWS)], 3)
    recorded = []
    with pytest.raises(StopDrafting):
        for hidden, logits, _ in draft_steps(3):
            probs = logits.softmax(-1)
            tokens = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(0))[:, 0]
            recorded.append(probs)
            batch.step(hidden, logits, tokens, probs)
    assert torch.equal(batch.draft_probs(), torch.stack(recorded, dim=1))


def test_the_sections_defaults_are_the_engines(tmp_path):
    head = random_head()  # a stored threshold, set by hand: no bound recorded
    head.save_pretrained(tmp_path / "head")
    settings = section_settings({"specdecpp": {"head": str(tmp_path / "head")}})
    engine = DecodingSettings(schedule="ada", head=head).with_head_defaults()
    assert settings.schedule == "ada" and settings.head.features == head.features
    assert (settings.stop_threshold, settings.bound) == (engine.stop_threshold, engine.bound) == ("auto", (2, 20))
    assert set(FIELDS) <= {f.name for f in fields(DecodingSettings)}
    assert section_settings({"other": {}}) is None and section_settings(None) is None


@pytest.mark.parametrize("section, message", [
    ({"head": "H", "num_assistant_tokens": 3}, "unknown fields ['num_assistant_tokens']"),
    ({"head": "H", "schedule": "ada-tree"}, "which drafts chains: the token-tree schedules"),
    ({"head": "H", "tree_nodes": 16}, "which drafts chains: the token-tree schedules"),
    ({"stop_threshold": 0.3}, "['head'] is missing"),
    ("head", "must be a dict"),
    ({"head": "H", "stop_threshold": 2.0}, "['stop_threshold'] must be in [0, 1]"),
    ({"head": "H", "bound": [0, 0]}, "['bound'] must be"),
])
def test_a_bad_section_is_a_clear_error(tmp_path, section, message):
    random_head().save_pretrained(tmp_path / "H")
    if isinstance(section, dict) and "head" in section:
        section = {**section, "head": str(tmp_path / "H")}
    with pytest.raises((ValueError, TypeError)) as error:
        section_settings({"specdecpp": section})
    assert message in str(error.value)


def test_auto_needs_a_stored_threshold(tmp_path):
    random_head(threshold=None).save_pretrained(tmp_path / "head")
    with pytest.raises(ValueError, match="stored threshold"):
        section_settings({"specdecpp": {"head": str(tmp_path / "head"), "stop_threshold": "auto"}})


def test_the_plugins_entry_point_imports_nothing_of_vllm():
    # vLLM only logs a plugin that fails to import: the entry point's module must load whatever vLLM moved.
    code = ("import sys, specdecpp.serving.vllm_plugin; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_register_never_raises_where_it_cannot_hook(monkeypatch, caplog):
    import specdecpp.serving.vllm_plugin as vllm_plugin

    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", None)  # no vLLM, or one that moved it
    vllm_plugin.register()
    assert "cannot check engine configs" in caplog.text


def test_the_round_timer_samples_rounds_and_prices_every_length():
    from specdecpp.serving.vllm_timing import RoundTimer

    timer = RoundTimer(7)
    assert [timer.next_length() for _ in range(8)] == [0, 1, 2, 3, 4, 6, 7, 0]  # 5 is not timed
    timer.record(2, 1, 0.000, [0.010], 0.011)  # after a reset (a prefill): not sampled
    timer.record(2, 2, 0.050, [0.053, 0.055], 0.056)
    timer.record(1, 0, 0.100, [0.102], 0.103)  # the batch changed: not sampled
    assert timer.verify == {(2, 1): [pytest.approx(39.0)]}
    assert timer.draft == {(2, 0): [pytest.approx(3.0)], (2, 1): [pytest.approx(2.0)]}
    timer.verify = {(2, k): [10.0 + 2 * k, 11.0 + 2 * k] for k in timer.lengths}
    timer.draft = {(2, j): [3.0, 3.0] for j in range(7)}
    assert timer.enough(2, 2) and not timer.enough(2, 3) and not timer.enough(4, 1)
    times = timer.times(2, torch.device("cpu"), "vllm test")
    assert times.verify_ms_measured == pytest.approx([10.5 + 2 * k for k in range(8)])  # k = 5 on the line
    assert times.draft_ms == [3.0] * 7 and times.repeats == 2 and times.engine == "vllm test"


def test_a_timed_round_proposes_its_length_from_every_row():
    from specdecpp.serving.vllm_timing import RoundTimer, TimedBatchRound

    timer = RoundTimer(4)
    for _ in range(3):  # lengths 0, 1, 2
        timer.next_length()
    settings = DecodingSettings(schedule="ada", head=random_head(), stop_threshold="auto", bound=(1, 20))
    batch = TimedBatchRound(timer, LeanJudge(settings.head), [make_schedule(settings) for _ in range(ROWS)], 4)
    assert batch.k == 3
    with pytest.raises(StopDrafting):
        for hidden, logits, tokens in draft_steps(5):
            batch.step(hidden, logits, tokens, None)
    assert len(batch.tokens) == 3 and batch.proposed_tokens() == 3 * ROWS
    assert [len(p) for p in batch.proposals()] == [3] * ROWS
