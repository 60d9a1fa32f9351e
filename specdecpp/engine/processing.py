"""Logits processors and stopping criteria as `generate` builds them, applied per position.

`generate` processes one position's logits at a time, with the prefix that position has. A
speculative round scores several positions at once (the target `k + 1` in one forward), so each
position is processed here with its own prefix: the prompt, the tokens kept so far and the drafted
tokens before it. The processors and criteria are transformers' own objects, built once per
generation by `generate`'s own builders from one generation config (docs/design.md, One round),
so the draft's and the target's logits get exactly the processing `target.generate` applies.
Stopping criteria are checked after every emitted token; a round ends at the first that stops.
"""
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
    """What one generation applies to every position: `processors`, the list `generate` applies to
    a position's logits (the warpers last, when `do_sample`), and `criteria`, the stopping criteria
    beyond the length limit and EOS. A transformers processor or criterion that is not a function
    of the prefix alone is refused (ValueError naming it); one of the user's own is taken at its
    word (`LogitsProcessor.__call__(input_ids, scores)`), and criteria get `scores=None`."""

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
        # Without a processor that reads the prefix, rows are processed together, as before this module.
        self.reads_prefix = any(not isinstance(p, WARPERS) for p in self.processors)
        self.changes_logits = len(self.processors) > 0

    def logits(self, tokens: list[int], logits: torch.Tensor) -> torch.Tensor:
        """The processed rows of `logits` `[n, vocab]` (float32 or wider), which score the tokens after
        the last `n` prefixes of `tokens`: row `i` follows `tokens[:len(tokens) - n + 1 + i]`."""
        logits = widened(logits)
        if not self.reads_prefix or not len(logits):
            return self._apply(None, logits) if self.changes_logits else logits
        ids = torch.tensor([tokens], device=logits.device)
        start = len(tokens) - len(logits) + 1
        return torch.cat([self._apply(ids[:, :start + i], logits[i:i + 1]) for i in range(len(logits))])

    def _apply(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        # Each processor called directly: LogitsProcessorList.__call__ inspects every processor's
        # signature on every call (for keyword arguments the loop never has), 0.15 ms a position.
        for processor in self.processors:
            scores = processor(input_ids, scores)
        return scores

    def stop_length(self, seq: list[int], new_tokens: list[int]) -> int | None:
        """How many of `new_tokens` (emitted after `seq`) to keep when a stopping criterion is met by
        one of them (up to and including the first such token, as `generate` stops), else None."""
        if not self.criteria:
            return None
        ids = torch.tensor([seq + new_tokens])
        for kept in range(1, len(new_tokens) + 1):
            if bool(self.criteria(ids[:, :len(seq) + kept], None).any()):
                return kept
        return None


def _refused(item, allowed: tuple[type, ...]) -> bool:
    """Whether `item` is one of transformers' classes outside `allowed` (a user's own class is taken)."""
    return type(item).__module__.startswith("transformers.") and not isinstance(item, allowed)


def build_processing(target: PreTrainedModel, config: GenerationConfig, input_ids: torch.LongTensor,
                     logits_processor: LogitsProcessorList | None = None,
                     stopping_criteria: StoppingCriteriaList | None = None, tokenizer=None) -> Processing:
    """The `Processing` that `target.generate(input_ids, generation_config=config,
    logits_processor=..., stopping_criteria=..., tokenizer=...)` would apply, built by `generate`'s
    own builders (`config` is copied; stop strings need the `tokenizer`)."""
    config = GenerationConfig.from_dict(config.to_dict())
    processors, criteria = generate_processing(target, config, input_ids, logits_processor or LogitsProcessorList(),
                                               stopping_criteria or StoppingCriteriaList(), tokenizer)
    return Processing(processors, criteria, bool(config.do_sample))


def sampling_only(do_sample: bool, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Processing:
    """The processing of a generation set by its sampling settings alone (`sampling.make_warpers`;
    nothing when greedy): what step timing runs."""
    warpers = make_warpers(temperature, top_k, top_p) if do_sample else LogitsProcessorList()
    return Processing(warpers, StoppingCriteriaList(), do_sample)
