"""Step timing: the probe's rounds are the loop's own draft and verification, timed step by step."""
from __future__ import annotations

import json
import time

import pytest
import torch

from specdecpp import custom_generate
from specdecpp.costs import StepTimes
from specdecpp.engine import compiled
from specdecpp.engine.decoding import GenerationStats, draft_round
from specdecpp.engine.draft_step import CachedModel, EagerDraft
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.schedules import HeadJudge
from specdecpp import speculative_generate
from specdecpp.head.model import AcceptancePredictionHead, LeanJudge
from specdecpp.measuring import step_timing
from specdecpp.measuring.step_timing import StepProbe, TimedRound, measure_cost_ratio


def proposer_head(accept_prob: float) -> AcceptancePredictionHead:
    """A proposer head over the tiny pair's 32-wide states whose P(accept) is `accept_prob`."""
    head = AcceptancePredictionHead(32, num_layers=0, alignment="proposer")
    with torch.no_grad():
        head.model[-1].weight.zero_()
        head.model[-1].bias.copy_(torch.tensor([0.0, float(torch.logit(torch.tensor(accept_prob)))]))
    return head.double()


def test_a_timed_round_drafts_k_tokens_through_the_loop_and_splits_its_times_by_step(tiny_pair):
    """`TimedRound` drafts exactly k tokens in `draft_round`, judging each, and its per-step times
    add up to what the loop recorded."""
    _, draft = tiny_pair
    stats = GenerationStats()
    judged = []

    class CountingJudge(HeadJudge):
        def __call__(self, step):
            judged.append(step.num_drafted)
            return super().__call__(step)

    head = proposer_head(0.1)
    judge = CountingJudge(head)
    policy = TimedRound(4, judge, stats)
    policy.start_round()
    seq = [5, 9, 17, 3]
    with torch.inference_mode():
        drafted, _ = draft_round(EagerDraft(draft, sampling_only(False), LeanJudge(head)), seq, policy, 4, False, None,
                                 stats)
        greedy = draft.generate(torch.tensor([seq]), max_new_tokens=4, do_sample=False)[0, len(seq):].tolist()
    assert drafted == greedy and stats.draft_calls == 4
    steps = policy.step_ms()
    assert len(steps) == 4 and all(draft_ms > 0 and judge_ms > 0 for draft_ms, judge_ms in steps)
    assert sum(draft_ms for draft_ms, _ in steps) == pytest.approx(1000 * stats.draft_time)
    assert sum(judge_ms for _, judge_ms in steps) == pytest.approx(1000 * stats.schedule_time)
    assert judged == [1, 2, 3, 4]  # every drafted token was judged


def test_the_probe_times_the_loops_own_draft_round_and_verify(tiny_pair, monkeypatch):
    """Each pass: `max_draft + 1` rounds of `decoding.draft_round`, one of each length, and
    `decoding.verify` for each of them and each target-alone step."""
    target, draft = tiny_pair
    calls = {"draft_round": [], "verify": 0}

    def counted_draft_round(draft_model, seq, policy, max_tokens, *args):
        calls["draft_round"].append(max_tokens)
        return draft_round(draft_model, seq, policy, max_tokens, *args)

    def counted_verify(*args):
        calls["verify"] += 1
        return verify(*args)

    verify = step_timing.verify
    monkeypatch.setattr(step_timing, "draft_round", counted_draft_round)
    monkeypatch.setattr(step_timing, "verify", counted_verify)
    probe = StepProbe(target, draft, torch.tensor([[5, 9, 17, 3]]), max_draft=3, head=proposer_head(0.8), warmup=0)
    probe.sample(2)
    assert calls == {"draft_round": [0, 1, 2, 3] * 2, "verify": 2 * (4 + 4)}
    times = probe.times()
    assert len(times.draft_ms) == 3 and len(times.verify_ms) == 4 and times.judge_ms > 0 and times.repeats == 2


def test_the_probe_leaves_the_rollback_after_a_verification_untimed(tiny_pair, monkeypatch):
    """The loop times a verification without the rollback after it (that is the loop's own time, priced as round
    overhead), and so does the probe: a rollback made 20 ms slow moves no step time."""
    target, draft = tiny_pair

    def slow_crop(model, length):
        time.sleep(0.02)
        crop(model, length)

    crop = CachedModel.crop
    monkeypatch.setattr(CachedModel, "crop", slow_crop)
    probe = StepProbe(target, draft, torch.tensor([[5, 9, 17, 3]]), max_draft=2, warmup=0)
    probe.sample(2)
    times = probe.times()
    assert times.target_alone_ms < 20 and max(times.verify_ms_measured) < 20 and max(times.draft_ms) < 20


def test_cost_ratio_is_measured_on_cached_steps(tiny_pair):
    target, draft = tiny_pair
    cost = measure_cost_ratio(target, draft, torch.tensor([[1, 2, 3, 4, 5]]), steps=3, warmup_steps=1)
    assert cost["cost_ratio"] == pytest.approx(cost["draft_step_ms"] / cost["target_verify_ms"])
    assert cost["k"] == 4 and cost["steps"] == 3


def head_with_rounds(draft_hidden: int, stored: dict) -> AcceptancePredictionHead:
    """A proposer head whose stored threshold (0.5) was priced with `stored` step times, with the
    rounds of a two-threshold grid to choose again from: long rounds at 0.9, short at 0.1."""
    head = AcceptancePredictionHead(draft_hidden, num_layers=1, alignment="proposer", features=["log_q"])
    return head.with_threshold(0.5, {"bound": [1, 4], "thresholds": [0.1, 0.9], "tokens": 100,
                                     "round_weights": [[0, 50, 0, 0, 0], [0, 0, 0, 0, 25]],
                                     "judged_step_times": stored})


def test_a_processor_is_named_by_its_model_and_the_instruction_set_torch_uses():
    name = step_timing.processor_name(torch.device("cpu"))
    assert name.endswith(f" ({torch.backends.cpu.get_cpu_capability()})") and len(name) > len(" (X)")
    assert step_timing.processor_name(torch.device("meta")) == "meta"


def test_auto_prices_the_device_it_runs_on_once_and_keeps_the_times(tiny_pair, tmp_path, monkeypatch):
    target, draft = tiny_pair
    here = {"device": "cpu", "processor": step_timing.processor_name(torch.device("cpu")), "engine": "eager",
            "threads": torch.get_num_threads()}
    assert step_timing.auto_step_times(head_with_rounds(draft.config.hidden_size, here), target, draft) is None
    monkeypatch.setattr(step_timing, "device_step_times", lambda *args, **kwargs: "timed here")
    for elsewhere in ({**here, "processor": "Other CPU (AVX512)"}, {k: v for k, v in here.items() if k != "processor"}):
        # another CPU model, or times that do not say which: a CPU's prices are its own
        assert step_timing.auto_step_times(head_with_rounds(draft.config.hidden_size, elsewhere), target, draft) \
            == "timed here"
    monkeypatch.undo()

    head = head_with_rounds(draft.config.hidden_size, {**here, "device": "cuda:0"})
    monkeypatch.setattr(step_timing, "STEP_TIMES_CACHE", tmp_path)
    times = step_timing.auto_step_times(head, target, draft)
    assert times.device == "cpu" and times.processor == here["processor"] and times.judge_ms > 0
    assert len(list(tmp_path.glob("*.json"))) == 1
    monkeypatch.setattr(step_timing, "measure_costs", lambda *args, **kwargs: pytest.fail("timed twice"))
    assert step_timing.auto_step_times(head, target, draft) == times  # read back, not timed again
    [kept] = tmp_path.glob("*.json")
    data = json.loads(kept.read_text())
    data["judged_step_times"]["verify_ms"] = [99.0] * len(times.verify_ms)  # as an older fit priced them
    kept.write_text(json.dumps(data))
    assert step_timing.auto_step_times(head, target, draft) == times  # priced again from the kept medians
    assert head.resolve_stop_threshold("auto", times) == head.threshold_for(times) in (0.1, 0.9)
    prompt = torch.tensor([[1, 2, 3]])
    for step_times in (times, None):  # given, or left out: this processor's, kept (not the stored 0.5 of cuda:0)
        stats = speculative_generate(target, draft, prompt, head=head, stop_threshold="auto", bound=(1, 4),
                                     step_times=step_times, max_new_tokens=6).stats
        assert stats.stop_threshold == head.threshold_for(times) != 0.5
        assert stats.threshold_step_times.startswith("cpu eager")

    bare = AcceptancePredictionHead(draft.config.hidden_size, 1, "proposer", ["log_q"]).with_threshold(
        0.5, {"judged_step_times": {**here, "device": "cuda:0"}})
    with pytest.warns(UserWarning, match="stores no replayed rounds"):
        assert step_timing.auto_step_times(bare, target, draft) is None


def test_a_threshold_set_by_hand_is_used_as_it_is_without_a_warning(tiny_pair, recwarn):
    target, draft = tiny_pair
    head = AcceptancePredictionHead(draft.config.hidden_size, 1, "proposer", ["log_q"]).with_threshold(0.5, {})
    assert step_timing.auto_step_times(head, target, draft) is None
    stats = speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), head=head, stop_threshold="auto",
                                 bound=(1, 4), max_new_tokens=6).stats
    assert stats.stop_threshold == 0.5 and stats.threshold_step_times is None
    assert not [w for w in recwarn if "priced" in str(w.message)]


@pytest.mark.slow  # compiles the tiny pair's graphs
@pytest.mark.skipif(not compiled.STATIC_CACHE_CROPS, reason="transformers < 5.24: compile=True is refused")
def test_the_probe_times_the_engines_of_the_generations_it_prices(tiny_pair, monkeypatch):
    """Given `max_length`, the probe runs on the compiled engines of generations that long (512 tokens here), not
    on those its own short context would take (256)."""
    monkeypatch.setattr(compiled, "_engines", compiled.weakref.WeakKeyDictionary())
    target, draft = tiny_pair
    context = torch.tensor([[5, 9, 17, 3]])
    probe = StepProbe(target, draft, context, max_draft=2, warmup=0, compile=True, max_length=300)
    probe.sample()
    assert {capacity for model in (target, draft) for _, capacity in compiled._engines[model]} == {512}


def test_a_tree_level_is_timed_by_the_nodes_it_expands(tiny_pair, monkeypatch):
    """Each width's price comes from trees whose levels after the root expand exactly that many nodes, less the
    root's level alone; an auto-sized ada-tree left without step times is priced with them, timed once."""
    target, draft = tiny_pair
    grown, real = [], step_timing.grow_tree

    def recording(*args):
        out = real(*args)
        grown.append(args[-1].tree_level_widths[-1])
        return out

    monkeypatch.setattr(step_timing, "grow_tree", recording)
    head = proposer_head(0.5)
    level_ms = step_timing.measure_level_ms(target, draft, torch.tensor([[5, 9, 17, 3]]), head, 3, depth=4,
                                            repeats=2)
    assert len(level_ms) == 3 and all(ms > 0 for ms in level_ms)
    assert {tuple(widths) for widths in grown} == {(1,), (1, 1, 1, 1), (1, 2, 2, 2), (1, 3, 3, 3)}

    timed = []
    monkeypatch.setattr(custom_generate, "device_step_times", lambda *args, **kwargs: timed.append(kwargs) or
                        StepTimes(draft_ms=[0.1], verify_ms=[1.0] * 4, target_alone_ms=1.0, level_ms=level_ms))
    stats = speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), head=head, schedule="ada-tree",
                                 stop_threshold=0.9, bound=(1, 4), tree_width=3, max_new_tokens=6).stats
    assert timed == [{"tree_width": 3}] and stats.generated_length == 6
