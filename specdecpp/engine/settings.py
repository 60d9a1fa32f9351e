"""The decoding settings, one dataclass with its validation, as the engine takes them.

`speculative_generate` builds a `DecodingSettings` from its keyword arguments; evaluation builds
one per method and the `generate` integration one per call; `make_schedule` reads the schedule's
knobs from it. A new setting is a field here, its check in `validate` (values alone) or
`check_models` (values against the models), and its use where it acts.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields

from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList

from specdecpp.checks import check_can_roll_back, check_head_fits_draft, check_same_vocab, hidden_size, vocab_size
from specdecpp.costs import StepTimes
from specdecpp.engine.online import OnlineAcceptanceEstimator
from specdecpp.engine.processing import CRITERIA_FIELDS, NEUTRAL, PROCESSOR_FIELDS
from specdecpp.head.model import AcceptancePredictionHead

SCHEDULES = ("none", "constant", "heuristic", "dynamic", "ada", "online", "oracle", "verify-budget", "ada-budget")
BUDGET_SCHEDULES = ("verify-budget", "ada-budget")  # draft a block, verify the prefix worth its price (step_times)
K_SCHEDULES = ("constant", "heuristic", "dynamic", *BUDGET_SCHEDULES)  # the schedules that read num_assistant_tokens
HEAD_SCHEDULES = ("ada", "ada-budget")  # the schedules that judge with a head


@dataclass
class DecodingSettings:
    """How one generation decodes: the candidate-length `schedule` (see `SCHEDULES`; None picks
    one from the models, see `default_schedule`) and its knobs (`head`, `stop_threshold`, `bound`
    for `ada`, and `online` to recalibrate its head online; `stop_threshold`, `bound` for
    `online`; `estimator`, the `OnlineAcceptanceEstimator` that `online` and `ada` with `online`
    learn in, None for a fresh one per generation; `num_assistant_tokens`,
    `assistant_confidence_threshold` for the others; `num_assistant_tokens`, the block drafted, and
    `step_times`, the measured `StepTimes` that price each verified length, for `verify-budget` and
    `ada-budget`, see `budget_step_times`), the
    length limit, greedy or sampling (`temperature`, `top_k`, `top_p`) and the EOS ids (None: the
    target's generation config's), and whether to run the compiled engine (`compile`). The
    processing fields (`PROCESSOR_FIELDS`, `CRITERIA_FIELDS`; None: off) mean what they mean to
    `generate`, and `logits_processor` / `stopping_criteria` add the caller's own objects. The
    defaults are `speculative_generate`'s."""

    schedule: str | None = None
    head: AcceptancePredictionHead | None = None
    stop_threshold: float | str = 0.3
    bound: tuple[int, int] = (2, 20)
    num_assistant_tokens: int = 5
    assistant_confidence_threshold: float = 0.4
    online: bool = False
    estimator: OnlineAcceptanceEstimator | None = None
    step_times: StepTimes | None = None
    max_new_tokens: int = 128
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    eos_token_id: int | list[int] | None = None
    compile: bool = False
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    min_new_tokens: int | None = None
    min_length: int | None = None
    bad_words_ids: list[list[int]] | None = None
    suppress_tokens: list[int] | None = None
    begin_suppress_tokens: list[int] | None = None
    sequence_bias: dict | list | None = None
    forced_eos_token_id: int | list[int] | None = None
    stop_strings: str | list[str] | None = None
    max_time: float | None = None
    logits_processor: LogitsProcessorList | None = None
    stopping_criteria: StoppingCriteriaList | None = None

    def validate(self, name: Callable[[str], str] = str) -> None:
        """Raise ValueError, naming the setting, on a value the loop cannot honour: an unknown
        schedule, a negative length, a threshold outside [0, 1] (or `"auto"` for `stop_threshold`),
        a bound out of order, K < 1 for a schedule that reads K, the oracle or a budget schedule with
        sampling, `online` without a numeric threshold, `online=True` for a schedule without a head,
        an estimator shorter than the bound (than the block, for `verify-budget`). `name` spells a
        setting's name in the messages (a command passes `lambda s: "--" + s`)."""
        schedule, bound = self.schedule, self.bound
        if schedule is not None and schedule not in SCHEDULES:
            raise ValueError(f"unknown {name('schedule')} {schedule!r}; choose from {', '.join(SCHEDULES)}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError(f"{name('max_new_tokens')} must be an int >= 0, got {self.max_new_tokens!r}")
        threshold = self.stop_threshold
        if threshold != "auto" and not (isinstance(threshold, (int, float)) and 0.0 <= threshold <= 1.0):
            raise ValueError(f"{name('stop_threshold')} must be in [0, 1] or 'auto', got {threshold!r}")
        if not 0.0 <= self.assistant_confidence_threshold <= 1.0:
            raise ValueError(f"{name('assistant_confidence_threshold')} must be in [0, 1], "
                             f"got {self.assistant_confidence_threshold}")
        if len(bound) != 2 or not all(isinstance(b, int) for b in bound) or not 0 <= bound[0] <= bound[1] \
                or bound[1] < 1:
            raise ValueError(f"{name('bound')} must be (min, max) integers with 0 <= min <= max and max >= 1, "
                             f"got {tuple(bound)}")
        if schedule in K_SCHEDULES and self.num_assistant_tokens < 1:
            raise ValueError(f"{name('num_assistant_tokens')} must be >= 1 for schedule {schedule!r}, "
                             f"got {self.num_assistant_tokens}")
        if schedule == "oracle" and self.do_sample:
            raise ValueError("the oracle schedule is defined for greedy decoding only (do_sample=False)")
        if schedule in BUDGET_SCHEDULES and self.do_sample:
            # The survival of the slots after y_j reads the draft's distributions after y_j, so whether y_j is
            # verified would depend on y_j itself: a choice the acceptance test cannot correct for.
            raise ValueError(f"schedule {schedule!r} is defined for greedy decoding only (do_sample=False): it chooses "
                             "how many drafted tokens to verify from scores that read the drafted tokens, which "
                             "would bias sampled output")
        if schedule == "online" and threshold == "auto":
            raise ValueError(f"schedule 'online' has no stored threshold: give {name('stop_threshold')} a number "
                             "(calibration --choose_threshold reports the best one on records)")
        if self.online and schedule not in (None, "ada"):
            raise ValueError(f"{name('online')} recalibrates ada's head; schedule {schedule!r} has none")
        estimator = self.estimator
        if estimator is not None and schedule in ("online", "ada", None) and estimator.num_positions < bound[1]:
            raise ValueError(f"the estimator has {estimator.num_positions} positions and {name('bound')} lets a round "
                             f"draft {bound[1]}: make it with num_positions >= {bound[1]}")
        block = self.num_assistant_tokens
        if estimator is not None and schedule == "verify-budget" and estimator.num_positions < block:
            raise ValueError(f"the estimator has {estimator.num_positions} positions and "
                             f"{name('num_assistant_tokens')} drafts {block}: make it with num_positions >= {block}")

    def check_models(self, target: PreTrainedModel, draft: PreTrainedModel | None) -> None:
        """Raise ValueError unless the models (and the head) fit the schedule: a draft for every
        schedule but `none`, sharing the target's vocabulary; for `ada` a head trained for this
        draft, holding a stored threshold when `stop_threshold="auto"` (with a warning when that
        threshold was chosen for the other decoding mode); for `ada-budget` a proposer head trained
        for this draft; step times for the budget schedules (`budget_step_times`). Models with
        recurrent layers are refused (`checks.check_can_roll_back`), the target too: the loop rolls
        its cache back."""
        check_can_roll_back(target, "the target")
        if self.schedule == "none":
            return
        if draft is None:
            raise ValueError(f"schedule {self.schedule!r} needs a draft model")
        check_can_roll_back(draft, "the draft")
        check_same_vocab(vocab_size(target), vocab_size(draft))
        if self.schedule in HEAD_SCHEDULES:
            if self.head is None:
                raise ValueError(f"schedule {self.schedule!r} needs an acceptance prediction head "
                                 "(head=AcceptancePredictionHead...)")
            check_head_fits_draft(self.head.hidden_size, hidden_size(draft.config))
        if self.schedule == "ada":
            self.head.resolve_stop_threshold(self.stop_threshold)
            if self.stop_threshold == "auto":
                self._warn_on_threshold_mismatch()
        if self.schedule == "ada-budget" and self.head.alignment != "proposer":
            # A reader head judges y_j only from the step that drafts y_{j+1}: a block's last token would go unscored.
            raise ValueError("schedule 'ada-budget' needs a proposer head, which scores every drafted token of the "
                             "block when it drafts it; this head is a reader")
        if self.schedule in BUDGET_SCHEDULES:
            self.budget_step_times()

    def budget_step_times(self) -> StepTimes:
        """The step times that price a budget schedule's verifications: `step_times` when set, else
        those the head's threshold was chosen with (`ada-budget`: with its judgements, the
        selection's `judged_step_times`; `verify-budget`: without, its `step_times`), else a
        ValueError that says where step times come from."""
        if self.step_times is not None:
            return self.step_times
        selection = (self.head.threshold_selection if self.head is not None else None) or {}
        stored = selection.get("judged_step_times" if self.schedule == "ada-budget" else "step_times")
        if stored is None:
            raise ValueError(f"schedule {self.schedule!r} prices each verified length with measured step times, and "
                             "none were given: pass step_times=StepTimes(...) (specdecpp.measuring.step_timing.measure_costs "
                             "times this pair; specdecpp.head.folder.stored_step_times reads those a head folder "
                             "stores), or a head whose threshold selection stores them")
        return StepTimes(**stored)

    def _warn_on_threshold_mismatch(self) -> None:
        """Warn when the head's stored threshold was chosen for another decoding mode or other
        logits processing than this generation's: acceptance, hence the best threshold, depends on both."""
        mode = "sampling" if self.do_sample else "greedy"
        if self.head.threshold_mode != mode:
            warnings.warn(f"stop_threshold='auto' is this head's threshold for {self.head.threshold_mode} "
                          f"decoding, chosen on {self.head.threshold_mode} records, and this generation is "
                          f"{mode}: a head trained and calibrated on {mode} records predicts better here",
                          stacklevel=4)
        if self.head.threshold_processing != self.processing_fields():
            warnings.warn(f"stop_threshold='auto' is this head's threshold for the processing "
                          f"{self.head.threshold_processing or 'none'}, and this generation applies "
                          f"{self.processing_fields() or 'none'}: a threshold chosen on records built with this "
                          "processing fits better here", stacklevel=4)

    def processing_fields(self) -> dict:
        """The logits processing fields that are set (neither None nor neutral), by name: what records
        built for a head, and the threshold chosen on them, record (`threshold_selection["processing"]`)."""
        values = {name: getattr(self, name) for name in PROCESSOR_FIELDS}
        return {name: value for name, value in values.items() if value is not None and value != NEUTRAL.get(name)}

    def generation_config(self, prompt_length: int, eos: set[int]) -> GenerationConfig:
        """The generation config `generate` would decode these settings with, for a prompt of
        `prompt_length` tokens and the EOS ids `eos`: what the processors and criteria are built from."""
        sampling = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p) if self.do_sample else {}
        fields_set = {name: getattr(self, name) for name in CRITERIA_FIELDS if getattr(self, name) is not None}
        return GenerationConfig(do_sample=self.do_sample, max_length=prompt_length + self.max_new_tokens,
                                eos_token_id=sorted(eos) or None, **sampling, **self.processing_fields(), **fields_set)

    def as_kwargs(self) -> dict:
        """The settings as `speculative_generate`'s keyword arguments."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def default_schedule(draft: PreTrainedModel | None, head: AcceptancePredictionHead | None) -> str:
    """The schedule `speculative_generate` runs when none is named: `ada` with a head, `dynamic`
    (transformers' default for assisted generation) with a draft alone, `none` without a draft."""
    if head is not None:
        return "ada"
    return "dynamic" if draft is not None else "none"
