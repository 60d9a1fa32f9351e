"""The plugin's work apart from vLLM (`specdecpp.serving.vllm`): one head forward over a batch's
draft step stops each row where the eager engine's per-token judgement (`schedules.Ada`) stops it,
the loop ends once every row has stopped, and the `additional_config` section's settings and
errors. tests/test_serving_vllm_draft.py runs the plugin inside vLLM."""
from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from specdecpp import AcceptancePredictionHead
from specdecpp.engine.draft_step import DraftStep
from specdecpp.engine.schedules import make_schedule
from specdecpp.head.model import LeanJudge
from specdecpp.engine.settings import DecodingSettings
from specdecpp.serving.vllm import FIELDS, BatchRound, StopDrafting, section_settings

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


def eager_lengths(settings: DecodingSettings, steps: list, max_draft: int) -> list[int]:
    """Each row's round length as the eager engine judges it: token by token, `LeanJudge` then `Ada.stop_after` on
    the step's hidden state, logits and softmax."""
    lengths, judge = [], LeanJudge(settings.head)
    for row in range(ROWS):
        schedule = make_schedule(settings)
        schedule.start_round()
        for j, (hidden, logits, tokens) in enumerate(steps, start=1):
            probs = logits[row].softmax(-1)
            step = DraftStep(num_drafted=j, token_prob=0.0, hidden=hidden[row], token=int(tokens[row]),
                             logits=logits[row], probs=probs,
                             accept_prob=float(judge(hidden[row], logits[row], tokens[row], probs)))
            if schedule.stop_after(step) or j == max_draft:
                break
        lengths.append(j)
    return lengths


def batch_lengths(settings: DecodingSettings, steps: list, max_draft: int) -> tuple[list[int], BatchRound]:
    schedules = [make_schedule(settings) for _ in range(ROWS)]
    batch = BatchRound(settings.head, schedules, max_draft)
    with pytest.raises(StopDrafting):
        for hidden, logits, tokens in steps:
            batch.step(hidden, logits, tokens, None)
    return [len(p) for p in batch.proposals()], batch


@pytest.mark.parametrize("alignment, features", [("proposer", ("log_q", "entropy", "margin")), ("proposer", ()),
                                                 ("reader", ())])
def test_one_head_forward_stops_each_row_as_the_eager_judgement(alignment, features):
    settings = DecodingSettings(schedule="ada", head=random_head(alignment, features), stop_threshold="auto",
                                bound=(1, 20))
    steps = list(draft_steps(12))
    lengths, batch = batch_lengths(settings, steps, 12)
    assert lengths == eager_lengths(settings, steps, 12)
    assert len(set(lengths)) > 1  # the rows stop apart
    assert len(batch.tokens) == max(lengths)  # the loop ends with the last row's stop
    proposals = batch.proposals()
    for row, proposal in enumerate(proposals):
        assert proposal == [int(tokens[row]) for _, _, tokens in steps[:lengths[row]]]


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
    first, second = BatchRound(settings.head, schedules, 12), BatchRound(settings.head, schedules, 12)
    for batch in (first, second):
        with pytest.raises(StopDrafting):
            for hidden, logits, tokens in steps:
                batch.step(hidden, logits, tokens, None)
    assert first.proposals() == second.proposals()


def test_sampled_steps_keep_their_draft_probabilities():
    settings = DecodingSettings(schedule="ada", head=random_head(), stop_threshold="auto", bound=(1, 20))
    batch = BatchRound(settings.head, [make_schedule(settings) for _ in range(ROWS)], 3)
    recorded = []
    with pytest.raises(StopDrafting):
        for hidden, logits, _ in draft_steps(3):
            probs = logits.softmax(-1)
            tokens = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(0))[:, 0]
            recorded.append(probs)
            batch.step(hidden, logits, tokens, probs)
    assert torch.equal(batch.draft_probs(), torch.stack(recorded, dim=1))


def test_the_sections_defaults_are_the_engines(tmp_path):
    head = random_head()
    head.save_pretrained(tmp_path / "head")
    settings = section_settings({"specdecpp": {"head": str(tmp_path / "head")}})
    defaults = {f.name: f.default for f in fields(DecodingSettings)}
    assert settings.schedule == "ada" and settings.head.features == head.features
    assert (settings.stop_threshold, settings.bound) == (defaults["stop_threshold"], defaults["bound"])
    assert set(FIELDS) <= set(defaults)
    assert section_settings({"other": {}}) is None and section_settings(None) is None


@pytest.mark.parametrize("section, message", [
    ({"head": "H", "num_assistant_tokens": 3}, "unknown fields ['num_assistant_tokens']"),
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
