"""A new schedule is one class in one file: defined here, it runs through the engine, the
evaluation and the threshold replay with no change to another module."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import write_prompts
from test_threshold import greedy_records

from specdecpp import speculative_generate
from specdecpp.calibration.threshold import replayed_rounds, schedule_length
from specdecpp.engine.schedules import SCHEDULES, Schedule
from specdecpp.evaluation import arguments, runner


class Alternating(Schedule):
    """Rounds of 1, then `num_assistant_tokens`, drafted tokens in turn."""

    name = "test-alternating"
    reads_k = True

    def __init__(self, k: int):
        self.k, self.rounds = k, 0

    @classmethod
    def from_settings(cls, settings, draft_correct=None):
        return cls(settings.num_assistant_tokens)

    def max_draft(self) -> int:
        return 1 if self.rounds % 2 == 0 else self.k

    def end_round(self, num_verified: int, num_accepted: int) -> None:
        self.rounds += 1


# Defining the class registered it; it stays registered only while this file's tests run, so that
# other files' tests over every schedule do not depend on the order the files are collected in.
del SCHEDULES[Alternating.name]


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    monkeypatch.setitem(SCHEDULES, Alternating.name, Alternating)


def test_it_decodes_losslessly_through_speculative_generate(tiny_pair):
    target, draft = tiny_pair
    prompt = torch.tensor([[5, 9, 17, 3]])
    out = speculative_generate(target, draft, prompt, schedule="test-alternating", num_assistant_tokens=3,
                               max_new_tokens=20)
    expected = target.generate(prompt, max_new_tokens=20, do_sample=False)
    assert torch.equal(out.sequences, expected)
    lengths = out.stats.draft_lengths
    assert lengths[:4] == [1, 3, 1, 3] and all(k == (1 if i % 2 == 0 else 3) for i, k in enumerate(lengths[:-1]))


def test_the_replay_drafts_the_engines_rounds(tiny_pair):
    target, draft = tiny_pair
    records = greedy_records(target, draft, 3, 16)
    correct = [np.array(r["p_acc"]) == 1.0 for r in records]
    for index, record in enumerate(records):
        rounds = replayed_rounds(correct[index:index + 1], correct[index:index + 1],
                                 schedule_length(Alternating(3)), 20)
        stats = speculative_generate(target, draft, torch.tensor([record["prefix"]]), schedule="test-alternating",
                                     num_assistant_tokens=3, max_new_tokens=len(record["tokens"])).stats
        assert [drafted for *_, drafted in rounds] == stats.draft_lengths


def test_the_evaluation_compares_it(pair_dirs, tmp_path):
    summary = runner.evaluate(
        arguments.HeadPairArguments(target=pair_dirs[0], draft=pair_dirs[1], head=[]),
        arguments.MethodGrid(schedule=["test-alternating"], num_assistant_tokens=[3], baselines=["target"]),
        arguments.DecodingArguments(max_new_tokens=8).settings(),
        arguments.PromptSource(prompts=write_prompts(tmp_path / "prompts.jsonl", 2)),
        arguments.RunOptions(output=str(tmp_path / "out"), warmup_tokens=0, cost_steps_per_prompt=1, plots=False,
                            progress=False))
    assert [row["method"] for row in summary["summary"]] == ["target", "specdecpp:test-alternating"]
    assert summary["greedy_check"].startswith("greedy check passed")
