"""`generate`'s logits processors and stopping criteria, applied per position with its prefix (docs/design.md)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (EosTokenCriteria, EpsilonLogitsWarper, EtaLogitsWarper, ExponentialDecayLengthPenalty,
                          ForcedBOSTokenLogitsProcessor, ForcedEOSTokenLogitsProcessor, GenerationConfig,
                          InfNanRemoveLogitsProcessor, LogitNormalization, LogitsProcessorList, MaxLengthCriteria,
                          MaxTimeCriteria, MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor,
                          MinPLogitsWarper, NoBadWordsLogitsProcessor, NoRepeatNGramLogitsProcessor,
                          PrefixConstrainedLogitsProcessor, PreTrainedModel, RepetitionPenaltyLogitsProcessor,
                          SequenceBiasLogitsProcessor, StoppingCriteriaList, StopStringCriteria,
                          SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor, TypicalLogitsWarper)

from specdecpp.compat import generate_processing
from specdecpp.engine.sampling import SAMPLING_WARPERS, make_warpers, widened

# The generation-config fields that add logits processors, and those that add stopping criteria.
PROCESSOR_FIELDS = ("repetition_penalty", "no_repeat_ngram_size", "min_new_tokens", "min_length", "bad_words_ids",
                    "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "forced_eos_token_id")
CRITERIA_FIELDS = ("stop_strings", "max_time")
# Their values that add no processor (generate's prepared config holds them when unset).
NEUTRAL = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0, "min_length": 0}

# transformers' processors that ignore the prefix: one call processes many positions at once.
WARPERS = SAMPLING_WARPERS + (MinPLogitsWarper, TypicalLogitsWarper, EpsilonLogitsWarper, EtaLogitsWarper,
                              InfNanRemoveLogitsProcessor, LogitNormalization)
# transformers' processors that are a function of (prefix, logits) alone, hence exact per position.
# Left out: guidance (a second forward), watermarks (keyed state), model-specific processors.
PER_POSITION = WARPERS + (
    RepetitionPenaltyLogitsProcessor, NoRepeatNGramLogitsProcessor, MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor, NoBadWordsLogitsProcessor, SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor, SuppressTokensAtBeginLogitsProcessor, ForcedEOSTokenLogitsProcessor,
    ForcedBOSTokenLogitsProcessor, PrefixConstrainedLogitsProcessor, ExponentialDecayLengthPenalty)
LOOP_CRITERIA = (MaxLengthCriteria, EosTokenCriteria)  # the loop's own length limit and EOS trimming
PER_POSITION_CRITERIA = (MaxTimeCriteria, StopStringCriteria)


@dataclass
class Processing:
    """One generation's `processors` (warpers last when `do_sample`) and stopping `criteria` beyond the
    length limit and EOS; transformers' ones that are not a function of the prefix are refused."""

    processors: LogitsProcessorList
    criteria: StoppingCriteriaList
    do_sample: bool

    def __post_init__(self):
        self.criteria = StoppingCriteriaList(c for c in self.criteria if not isinstance(c, LOOP_CRITERIA))
        refused = [type(p).__name__ for p in self.processors if _refused(p, PER_POSITION)]
        refused += [type(c).__name__ for c in self.criteria if _refused(c, PER_POSITION_CRITERIA)]
        if refused:
            raise ValueError(f"SpecDec++ processes each drafted position with its own prefix, and "
                             f"{', '.join(refused)} cannot be applied that way (it needs a second forward, keeps "
                             "state across positions or is model-specific)")
        self.reads_prefix = any(not isinstance(p, WARPERS) for p in self.processors)
        self.changes_logits = len(self.processors) > 0

    def logits(self, tokens: list[int], logits: torch.Tensor) -> torch.Tensor:
        """The rows of `logits` `[n, vocab]` processed, row `i` with prefix `tokens[:len(tokens) - n + 1 + i]`."""
        logits = widened(logits)
        if not self.reads_prefix or not len(logits):
            return self._apply(None, logits) if self.changes_logits else logits
        ids = torch.tensor([tokens], device=logits.device)
        start = len(tokens) - len(logits) + 1
        return torch.cat([self._apply(ids[:, :start + i], logits[i:i + 1]) for i in range(len(logits))])

    def _apply(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        # Called directly: LogitsProcessorList.__call__ inspects each processor's signature every call.
        for processor in self.processors:
            scores = processor(input_ids, scores)
        return scores

    def stop_length(self, seq: list[int], new_tokens: list[int]) -> int | None:
        """How many of `new_tokens` to keep when a criterion stops at one of them (that one included), else None."""
        if not self.criteria:
            return None
        ids = torch.tensor([seq + new_tokens])
        for kept in range(1, len(new_tokens) + 1):
            if bool(self.criteria(ids[:, :len(seq) + kept], None).any()):
                return kept
        return None


def _refused(item, allowed: tuple[type, ...]) -> bool:
    return type(item).__module__.startswith("transformers.") and not isinstance(item, allowed)


def build_processing(target: PreTrainedModel, config: GenerationConfig, input_ids: torch.LongTensor,
                     logits_processor: LogitsProcessorList | None = None,
                     stopping_criteria: StoppingCriteriaList | None = None, tokenizer=None) -> Processing:
    """The `Processing` `target.generate(input_ids, generation_config=config, ...)` would apply."""
    config = GenerationConfig.from_dict(config.to_dict())
    processors, criteria = generate_processing(target, config, input_ids, logits_processor or LogitsProcessorList(),
                                               stopping_criteria or StoppingCriteriaList(), tokenizer)
    return Processing(processors, criteria, bool(config.do_sample))


def sampling_only(do_sample: bool, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Processing:
    """The processing set by sampling settings alone (nothing when greedy)."""
    warpers = make_warpers(temperature, top_k, top_p) if do_sample else LogitsProcessorList()
    return Processing(warpers, StoppingCriteriaList(), do_sample)
