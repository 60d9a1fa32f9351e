"""Each schedule policy on its own: the rule it implements, step by step."""
import pytest
import torch

from specdecpp.engine.draft_step import DraftStep
from specdecpp.engine.online import OnlineAcceptanceEstimator, log_odds, sigmoid
from specdecpp.engine.schedules import SCHEDULES, Ada, Heuristic, draft_log_odds, make_schedule
from specdecpp.engine.settings import DecodingSettings
from specdecpp.head.model import AcceptancePredictionHead


def schedule(name: str, draft_correct: list[bool] | None = None, **knobs):
    """A fresh policy of schedule `name` with `knobs` (`DecodingSettings`' fields)."""
    return make_schedule(DecodingSettings(schedule=name, **knobs), draft_correct)


def test_heuristic_grows_by_two_after_full_acceptance_and_shrinks_by_one_otherwise():
    policy = Heuristic(5)
    lengths = []
    for drafted, accepted in [(5, 5), (7, 7), (9, 3), (8, 0), (7, 0), (6, 6)]:
        assert policy.max_draft() == drafted
        policy.end_round(drafted, accepted)
        lengths.append(policy.max_draft())
    assert lengths == [7, 9, 8, 7, 6, 8]
    for _ in range(10):
        policy.end_round(policy.max_draft(), 0)
    assert policy.max_draft() == 1


def test_dynamic_stops_on_a_low_confidence_token():
    policy = schedule("dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4)
    assert policy.max_draft() == 20
    assert not policy.stop_after(DraftStep(1, 0.41))
    assert policy.stop_after(DraftStep(2, 0.39))


def judged(num_drafted: int, accept_prob: float) -> DraftStep:
    """A draft step whose head judged P(accept) = `accept_prob`."""
    return DraftStep(num_drafted, 1.0, accept_prob=accept_prob)


def test_ada_keeps_a_running_product_of_the_judged_tokens():
    head = AcceptancePredictionHead(4, num_layers=0)
    with torch.no_grad():
        head.model[-1].weight.zero_()
        head.model[-1].bias.copy_(torch.tensor([0.0, float(torch.logit(torch.tensor(0.8)))]))
    policy = Ada(head, stop_threshold=0.45, bound=(1, 10))
    assert policy.max_draft() == 10
    # j = 1: only the verified token's state is known, nothing is judged yet.
    assert not policy.stop_after(judged(1, 0.8)) and policy.p_all_accepted == 1.0
    assert not policy.stop_after(judged(2, 0.8))  # 1 - 0.8 = 0.2
    assert not policy.stop_after(judged(3, 0.8))  # 1 - 0.64 = 0.36
    assert policy.stop_after(judged(4, 0.8))      # 1 - 0.512 = 0.488 > 0.45
    assert policy.p_all_accepted == pytest.approx(0.8 ** 3)
    policy.start_round()  # a new round starts from certainty
    assert policy.p_all_accepted == 1.0


def constant_head(accept_prob: float, hidden_size: int = 4, **config) -> AcceptancePredictionHead:
    """A head whose P(accept) is `accept_prob` whatever it reads."""
    head = AcceptancePredictionHead(hidden_size, num_layers=0, **config)
    with torch.no_grad():
        head.model[-1].weight.zero_()
        head.model[-1].bias.copy_(torch.tensor([0.0, float(torch.logit(torch.tensor(accept_prob)))]))
    return head


def test_proposer_ada_judges_each_token_right_after_drafting_it():
    policy = Ada(constant_head(0.8, alignment="proposer"), stop_threshold=0.45, bound=(1, 10))
    assert policy.max_draft() == 10
    assert not policy.stop_after(judged(1, 0.8))  # 1 - 0.8 = 0.2
    assert not policy.stop_after(judged(2, 0.8))  # 1 - 0.64 = 0.36
    assert policy.stop_after(judged(3, 0.8))      # 1 - 0.512 = 0.488 > 0.45: one step sooner than a reader
    assert policy.p_all_accepted == pytest.approx(0.8 ** 3)


def test_proposer_ada_never_stops_before_min():
    policy = Ada(constant_head(0.1, alignment="proposer"), stop_threshold=0.3, bound=(3, 10))
    policy.max_draft()
    assert [policy.stop_after(judged(j, 0.1)) for j in (1, 2, 3)] == [False, False, True]


def test_ada_auto_threshold_comes_from_the_head():
    head = constant_head(0.8, alignment="proposer").with_threshold(0.25, {})
    assert schedule("ada", head=head, stop_threshold="auto").stop_threshold == 0.25
    with pytest.raises(ValueError, match="stored threshold"):
        schedule("ada", head=constant_head(0.8), stop_threshold="auto")


def test_oracle_drafts_the_run_of_correct_proposals():
    policy = schedule("oracle", draft_correct=[True, True, False, True, False, False, True], bound=(2, 20))
    runs = []
    for _ in range(4):
        run = policy.max_draft()
        runs.append(run)
        policy.end_round(run, run)
    assert runs == [2, 1, 0, 1]


def test_unknown_schedule():
    with pytest.raises(ValueError, match="unknown schedule"):
        DecodingSettings(schedule="fastest").validate()
    assert set(SCHEDULES) == {"none", "constant", "heuristic", "dynamic", "ada", "online", "oracle", "verify-budget",
                              "ada-budget", "ada-tree", "confidence-tree"}


def test_draft_log_odds_is_the_log_odds_of_the_top_probability_at_the_temperature():
    logits = torch.tensor([2.0, 0.5, -1.0, 0.0], dtype=torch.float64)
    for temperature in (1.0, 0.7):
        q = (logits / temperature).softmax(-1)
        expected = float(torch.log(q.max() / (1 - q.max())))
        assert draft_log_odds(DraftStep(1, 0.0, logits=logits), temperature) == pytest.approx(expected)
        # the compiled step hands its distribution only
        assert draft_log_odds(DraftStep(1, 0.0, probs=q), temperature) == pytest.approx(expected)
    assert draft_log_odds(DraftStep(1, 0.0, logits=torch.tensor([0.0, -1e4]))) == 40.0  # clamped
    assert draft_log_odds(DraftStep(1, 0.9)) == pytest.approx(log_odds(0.9))  # nothing but the token's probability


def test_online_judges_with_the_estimator_and_teaches_it_the_rounds_outcomes():
    estimator = OnlineAcceptanceEstimator(4, refit_interval=2)
    policy = schedule("online", estimator=estimator, stop_threshold=0.6, bound=(1, 4))
    assert policy.judge.estimator is estimator
    p = sigmoid(0.5 * log_odds(0.9) - 0.2)
    assert policy.max_draft() == 4
    stops = [policy.stop_after(DraftStep(j, 0.9)) for j in (1, 2, 3)]
    assert stops == [1 - p ** j > 0.6 for j in (1, 2, 3)]
    assert policy.judge.predictions == pytest.approx([p] * 3)
    policy.end_round(3, 1)
    assert [s[5] for s in estimator.window] == [1, 1, 0, 0] and estimator.steps == 1
    policy.start_round()
    policy.stop_after(DraftStep(1, 0.9))
    policy.end_round(1, 0)
    assert estimator.refits == 1 and estimator.intercepts != [-0.2] * 4  # it learned
    fresh = schedule("online", stop_threshold=0.6, bound=(1, 4))  # no estimator given: a fresh one
    assert fresh.judge.estimator is not estimator and fresh.judge.estimator.intercepts == [-0.2] * 4


def test_ada_online_starts_at_no_correction_and_learns():
    head = constant_head(0.8, alignment="proposer")
    plain = schedule("ada", head=head, stop_threshold=0.45, bound=(1, 10))
    online = schedule("ada", head=head, stop_threshold=0.45, bound=(1, 10), online=True)
    assert online.judge.estimator.slope == 1.0 and online.judge.estimator.intercepts == [0.0] * 10
    for policy in (plain, online):
        policy.max_draft()
    for j in (1, 2, 3):
        assert plain.stop_after(judged(j, 0.8)) == online.stop_after(judged(j, 0.8))
    assert online.p_all_accepted == pytest.approx(plain.p_all_accepted)
    assert online.judge.features == pytest.approx([log_odds(0.8)] * 3)  # the head's logit is the feature
    for _ in range(100):  # the head says 0.8, the target rejects every first token
        online.start_round()
        online.stop_after(judged(1, 0.8))
        online.end_round(1, 0)
    online.start_round()
    online.stop_after(judged(1, 0.8))
    assert online.judge.estimator.refits == 1 and online.p_all_accepted < 0.5
