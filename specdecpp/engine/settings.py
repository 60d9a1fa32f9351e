"""`DecodingSettings`: every decoding knob, its default and its validation, declared once."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import MISSING, dataclass, replace

from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList

from specdecpp.checks import check_can_roll_back, check_head_fits_draft, check_same_vocab, hidden_size, vocab_size
from specdecpp.costs import StepTimes
from specdecpp.engine.online import OnlineAcceptanceEstimator
from specdecpp.engine.processing import CRITERIA_FIELDS, NEUTRAL, PROCESSOR_FIELDS
from specdecpp.engine.schedules import MAX_TREE_NODES, SCHEDULES, Schedule
from specdecpp.head.model import AcceptancePredictionHead

# What `stop_threshold` and `bound` left out mean without a head that stores a threshold selection (the paper's
# text); with one, "auto" and the bound the selection was made with (`DecodingSettings.with_head_defaults`).
PLAIN_DEFAULTS = {"stop_threshold": 0.3, "bound": (2, 20)}


@dataclass
class DecodingSettings:
    """How one generation decodes: the `schedule` (in `SCHEDULES`; None: `default_schedule`) and its knobs, the length
    limit, sampling, EOS, engine and `generate`'s processing (None: off); `stop_threshold`, `bound` None: the head's."""

    schedule: str | None = None
    head: AcceptancePredictionHead | None = None
    stop_threshold: float | str | None = None
    bound: tuple[int, int] | None = None
    num_assistant_tokens: int = 5
    assistant_confidence_threshold: float = 0.4
    online: bool = False
    estimator: OnlineAcceptanceEstimator | None = None
    step_times: StepTimes | None = None
    tree_nodes: int | str = "auto"
    tree_width: int = 4
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

    @property
    def schedule_class(self) -> type[Schedule]:
        return SCHEDULES[self.schedule]

    @property
    def judging_head(self) -> AcceptancePredictionHead | None:
        """The head the schedule judges with, if it reads one."""
        return self.head if self.schedule is not None and self.schedule_class.needs_head else None

    @property
    def reads_head_threshold(self) -> bool:
        """Whether the head stores a threshold selection that this schedule (`ada`, `ada-tree`, or None with a head) reads."""
        return self.head is not None and self.head.stop_threshold is not None and self.schedule in (None, "ada", "ada-tree")

    def with_head_defaults(self) -> DecodingSettings:
        """A copy with `stop_threshold`, `bound` left out filled in: the head's selection's, else `PLAIN_DEFAULTS`."""
        stored = (self.head.threshold_selection or {}).get("bound") if self.reads_head_threshold else None
        threshold = "auto" if self.reads_head_threshold else PLAIN_DEFAULTS["stop_threshold"]
        return replace(self, stop_threshold=threshold if self.stop_threshold is None else self.stop_threshold,
                       bound=tuple(stored or PLAIN_DEFAULTS["bound"]) if self.bound is None else tuple(self.bound))

    def chain_settings(self) -> DecodingSettings:
        """The chain `ada` an `auto`-sized `ada-tree` may hand over to: its head, at the head's default threshold."""
        return replace(self, schedule="ada", stop_threshold=None).with_head_defaults()

    def validate(self, name: Callable[[str], str] = str) -> None:
        """ValueError naming the setting (`name` spells it) on a value the loop cannot honour."""
        if self.stop_threshold is None or self.bound is None:
            return self.with_head_defaults().validate(name)
        schedule, bound, threshold = self.schedule, self.bound, self.stop_threshold
        if schedule is not None and schedule not in SCHEDULES:
            raise ValueError(f"unknown {name('schedule')} {schedule!r}; choose from {', '.join(SCHEDULES)}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError(f"{name('max_new_tokens')} must be an int >= 0, got {self.max_new_tokens!r}")
        if threshold != "auto" and not (isinstance(threshold, (int, float)) and 0.0 <= threshold <= 1.0):
            raise ValueError(f"{name('stop_threshold')} must be in [0, 1] or 'auto', got {threshold!r}")
        if not 0.0 <= self.assistant_confidence_threshold <= 1.0:
            raise ValueError(f"{name('assistant_confidence_threshold')} must be in [0, 1], "
                             f"got {self.assistant_confidence_threshold}")
        if len(bound) != 2 or not all(isinstance(b, int) for b in bound) or not 0 <= bound[0] <= bound[1] \
                or bound[1] < 1:
            raise ValueError(f"{name('bound')} must be (min, max) integers with 0 <= min <= max and max >= 1, "
                             f"got {tuple(bound)}")
        if self.tree_nodes != "auto" and not (isinstance(self.tree_nodes, int) and 1 <= self.tree_nodes
                                              <= MAX_TREE_NODES):
            raise ValueError(f"{name('tree_nodes')} must be an int in [1, {MAX_TREE_NODES}] or 'auto', "
                             f"got {self.tree_nodes!r}")
        if not isinstance(self.tree_width, int) or not 1 <= self.tree_width <= MAX_TREE_NODES:
            raise ValueError(f"{name('tree_width')} must be an int in [1, {MAX_TREE_NODES}], got {self.tree_width!r}")
        if schedule is None:
            return
        policy = self.schedule_class
        if policy.reads_k and self.num_assistant_tokens < 1:
            raise ValueError(f"{name('num_assistant_tokens')} must be >= 1 for schedule {schedule!r}, "
                             f"got {self.num_assistant_tokens}")
        if policy.greedy_only and self.do_sample:
            raise ValueError(f"schedule {schedule!r} is defined for greedy decoding only (do_sample=False): its "
                             "rounds would depend on the drafted tokens in a way the acceptance test cannot correct")
        if self.online and not policy.recalibrates:
            raise ValueError(f"{name('online')} recalibrates a head online; schedule {schedule!r} has none")
        needed = policy.estimator_positions(self)
        if self.estimator is not None and needed is not None and self.estimator.num_positions < needed:
            raise ValueError(f"the estimator has {self.estimator.num_positions} positions and schedule {schedule!r} "
                             f"drafts up to {needed}: make it with num_positions >= {needed}")
        policy.check(self, name)

    def check_models(self, target: PreTrainedModel, draft: PreTrainedModel | None) -> None:
        """ValueError unless the models and the head fit the schedule (rollback, one vocabulary, step times)."""
        check_can_roll_back(target, "the target")
        policy = self.schedule_class
        if not policy.needs_draft:
            return
        if draft is None:
            raise ValueError(f"schedule {self.schedule!r} needs a draft model")
        check_can_roll_back(draft, "the draft")
        check_same_vocab(vocab_size(target), vocab_size(draft))
        if policy.needs_head:
            if self.head is None:
                raise ValueError(f"schedule {self.schedule!r} needs an acceptance prediction head "
                                 "(head=AcceptancePredictionHead...)")
            check_head_fits_draft(self.head.hidden_size, hidden_size(draft.config))
            policy.check_head(self)
        if policy.prices_rounds(self):
            self.budget_step_times()

    def budget_step_times(self) -> StepTimes:
        """A budget schedule's step times: `step_times`, else the head's stored ones, else ValueError."""
        if self.step_times is not None:
            return self.step_times
        selection = (self.head.threshold_selection if self.head is not None else None) or {}
        stored = selection.get("judged_step_times" if self.schedule_class.needs_head else "step_times")
        if stored is None:
            raise ValueError(f"schedule {self.schedule!r} prices its rounds with measured step times, and "
                             "none were given: pass step_times=StepTimes(...) (specdecpp.measuring.step_timing."
                             "measure_costs times this pair; specdecpp.head.folder.stored_step_times reads those a "
                             "head folder stores), or a head whose threshold selection stores them")
        return StepTimes(**stored)

    def warn_on_threshold_mismatch(self) -> None:
        """Warn when the head's stored threshold was chosen for another decoding mode or processing."""
        mode = "sampling" if self.do_sample else "greedy"
        if self.head.threshold_mode != mode:
            warnings.warn(f"stop_threshold='auto' is this head's threshold for {self.head.threshold_mode} "
                          f"decoding, chosen on {self.head.threshold_mode} records, and this generation is "
                          f"{mode}: a head trained and calibrated on {mode} records predicts better here",
                          stacklevel=5)
        if self.head.threshold_processing != self.processing_fields():
            warnings.warn(f"stop_threshold='auto' is this head's threshold for the processing "
                          f"{self.head.threshold_processing or 'none'}, and this generation applies "
                          f"{self.processing_fields() or 'none'}: a threshold chosen on records built with this "
                          "processing fits better here", stacklevel=5)

    def processing_fields(self) -> dict:
        """The logits processing fields that are set (neither None nor neutral), by name."""
        values = {name: getattr(self, name) for name in PROCESSOR_FIELDS}
        return {name: value for name, value in values.items() if value is not None and value != NEUTRAL.get(name)}

    def generation_config(self, prompt_length: int, eos: set[int]) -> GenerationConfig:
        """The generation config `generate` would decode these settings with."""
        sampling = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p) if self.do_sample else {}
        fields_set = {name: getattr(self, name) for name in CRITERIA_FIELDS if getattr(self, name) is not None}
        return GenerationConfig(do_sample=self.do_sample, max_length=prompt_length + self.max_new_tokens,
                                eos_token_id=sorted(eos) or None, **sampling, **self.processing_fields(), **fields_set)


def default(name: str):
    """`DecodingSettings`' default for the field `name` (`stop_threshold` and `bound`: without a head's selection)."""
    if name in PLAIN_DEFAULTS:
        return PLAIN_DEFAULTS[name]
    field = DecodingSettings.__dataclass_fields__[name]
    return field.default if field.default is not MISSING else field.default_factory()


def default_schedule(draft: PreTrainedModel | None, head: AcceptancePredictionHead | None) -> str:
    """`ada` with a head, `dynamic` (transformers' default) with a draft alone, else `none`."""
    return "ada" if head is not None else "dynamic" if draft is not None else "none"
