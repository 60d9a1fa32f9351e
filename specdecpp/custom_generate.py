"""SpecDec++ from `transformers`' own `generate` (its `custom_generate` convention, transformers 5).

Two forms:

- **A head folder or Hub repo.** Every folder `AcceptancePredictionHead.save_pretrained` writes carries
  `custom_generate/generate.py` (`head.folder.SHIM`) and `custom_generate/requirements.txt`, so

      target.generate(**inputs, assistant_model=draft, custom_generate=HEAD_DIR_OR_HUB_ID,
                      trust_remote_code=True, max_new_tokens=128, stop_threshold=0.3, bound=(2, 20))

  runs SpecDec++ with that head. transformers executes the shim, which calls `generate_from_head`:
  it loads the head from the folder or repo `custom_generate` named and hands the decoding loop
  to `hf_generate` through `generate`'s callable form, so transformers prepares the generation
  config (defaults, `max_new_tokens`, EOS, sampling settings) exactly as for its own methods.
- **The callable**, `custom_generate=specdecpp.hf_generate`, with `draft=` and `head=` (a head or
  a folder / Hub id): transformers hands a callable neither `assistant_model` nor `streamer`, so the
  draft comes as `draft=`, and streaming needs the folder form.

Either returns what `generate` returns: the token tensor, or (`return_dict_in_generate=True`) a
`GenerateDecoderOnlyOutput` (here `SpeculativeGenerateOutput`, which adds the round statistics).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation import (BaseStreamer, GenerateDecoderOnlyOutput, LogitsProcessorList, StoppingCriteriaList,
                                     StopStringCriteria)

from specdecpp.compat import CACHE_NAMES, cache_in, custom_generate_argument
from specdecpp.engine.decoding import GenerationStats, decode
from specdecpp.engine.online import RECALIBRATION_FILE, OnlineAcceptanceEstimator
from specdecpp.engine.processing import PROCESSOR_FIELDS, Processing
from specdecpp.engine.settings import DecodingSettings
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.measuring.costs import StepTimes
from specdecpp.measuring.step_timing import auto_step_times


# What `generate` prepares that the SpecDec++ loop may safely ignore: it keeps its own caches, and the
# stopping criteria `generate` built from the tokenizer reach it ready.
IGNORED_MODEL_KWARGS = {"position_ids", "cache_position", "logits_to_keep", "use_cache", "tokenizer", *CACHE_NAMES}
HUB_OPTIONS = ("revision", "cache_dir", "force_download", "local_files_only", "token")


@dataclass
class SpeculativeGenerateOutput(GenerateDecoderOnlyOutput):
    """What `generate(..., return_dict_in_generate=True)` returns with SpecDec++: a
    `GenerateDecoderOnlyOutput` whose `sequences` are set, plus `stats` (a `GenerationStats`)."""

    stats: GenerationStats | None = None


def hf_generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig | None = None,
    synced_gpus: bool = False,
    streamer: BaseStreamer | None = None,
    *,
    draft: PreTrainedModel | None = None,
    head: AcceptancePredictionHead | str | os.PathLike | None = None,
    schedule: str | None = None,
    stop_threshold: float | str | None = None,
    bound: tuple[int, int] | None = None,
    compile: bool = False,
    online: bool = False,
    estimator: OnlineAcceptanceEstimator | None = None,
    step_times: StepTimes | None = None,
    **model_kwargs,
) -> torch.LongTensor | SpeculativeGenerateOutput:
    """The SpecDec++ decoding loop in the shape `generate` calls a `custom_generate` callable:
    `target.generate(**inputs, custom_generate=specdecpp.hf_generate, draft=draft, head=HEAD, ...)`.
    `head` is a head or a folder / Hub id to load one from; `stop_threshold` and `bound` go to
    `speculative_generate` untouched; left out, they are the head's stored threshold (`"auto"`) and
    the bound it was chosen for, or `speculative_generate`'s defaults for a head that stores none.
    `schedule` defaults to `ada`; `compile=True` runs the compiled engine (`specdecpp.engine.compiled`).
    `online=True` recalibrates the head online (`ada`), and `estimator` is the state `online` or
    that recalibration learns in, carried across calls when the caller passes the same one (see
    `speculative_generate`); without one, a recalibration saved in the head folder `head` names
    (`OnlineAcceptanceEstimator.save(head_dir)`, `saved_recalibration`) is where it starts.
    `"auto"` is chosen for `step_times`, by default this device's (`step_timing.auto_step_times`).
    Length, EOS, sampling (temperature, top-k, top-p), `num_assistant_tokens` and
    `assistant_confidence_threshold` come from the generation config transformers prepared, and
    the logits processors and stopping criteria are the very ones it built (a repetition penalty,
    stop strings, ...), applied per position (`specdecpp.engine.processing`); what the loop cannot honour
    (a processor that is not a function of the prefix, beams) is a ValueError naming it, never
    silently dropped. Returns the token tensor, or a `SpeculativeGenerateOutput` when
    `return_dict_in_generate` is set."""
    config = generation_config if generation_config is not None else model.generation_config
    _check_generate_settings(config, model_kwargs)
    processing = Processing(logits_processor or LogitsProcessorList(), stopping_criteria or StoppingCriteriaList(),
                            bool(config.do_sample))
    if isinstance(head, (str, os.PathLike)):
        if online and estimator is None:
            estimator = saved_recalibration(head)
        head = AcceptancePredictionHead.from_pretrained(head)
    if head is not None and draft is not None:
        head = head.to(draft.device)
    if draft is None and schedule != "none":
        raise ValueError("SpecDec++ needs the draft model: pass draft=... with custom_generate=hf_generate "
                         "(transformers does not hand assistant_model to a custom_generate callable), or "
                         "assistant_model=... with custom_generate=<head folder or Hub id>")
    if stop_threshold is None and head is not None and head.stop_threshold is not None and schedule in (None, "ada"):
        # the head's publisher chose a threshold, for a bound: both are the defaults here
        stop_threshold = "auto"
        bound = bound if bound is not None else (head.threshold_selection or {}).get("bound")
    knobs = {"stop_threshold": stop_threshold, "bound": tuple(bound) if bound is not None else None}
    if stop_threshold == "auto" and schedule in (None, "ada") and step_times is None:
        step_times = auto_step_times(head, model, draft, compile)
    eos = config.eos_token_id
    settings = DecodingSettings(
        schedule=schedule, head=head, max_new_tokens=int(config.max_length) - input_ids.shape[-1],
        do_sample=bool(config.do_sample), temperature=1.0 if config.temperature is None else config.temperature,
        top_k=config.top_k or 0, top_p=1.0 if config.top_p is None else config.top_p,
        eos_token_id=[] if eos is None else eos, num_assistant_tokens=config.num_assistant_tokens,
        assistant_confidence_threshold=config.assistant_confidence_threshold, compile=compile, online=online,
        estimator=estimator, step_times=step_times,
        **{name: value for name, value in knobs.items() if value is not None},
        # what a head's stored threshold is compared with; the processors themselves come built
        **{name: getattr(config, name) for name in PROCESSOR_FIELDS})
    out = decode(model, draft, input_ids, settings, attention_mask=model_kwargs.get("attention_mask"),
                 streamer=streamer, processing=processing)
    if config.return_dict_in_generate:
        return SpeculativeGenerateOutput(sequences=out.sequences, stats=out.stats)
    return out.sequences


def _check_generate_settings(config: GenerationConfig, model_kwargs: dict) -> None:
    """ValueError for what `generate` was asked that the SpecDec++ loop would not honour (the
    processors and criteria are checked by `Processing`)."""
    if (config.num_beams or 1) > 1 or (config.num_return_sequences or 1) > 1:
        raise ValueError("SpecDec++ decodes one sequence: num_beams and num_return_sequences must be 1")
    extra_outputs = [name for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
                     if config.return_dict_in_generate and getattr(config, name, False)]
    if extra_outputs:
        raise ValueError(f"SpecDec++ returns the sequences (and stats) only, not {', '.join(extra_outputs)}")
    unknown = sorted(set(model_kwargs) - IGNORED_MODEL_KWARGS - {"attention_mask"})
    if unknown:
        raise ValueError(f"SpecDec++ cannot pass {', '.join(unknown)} to the models")
    cache = cache_in(model_kwargs)
    if cache is not None and cache.get_seq_length() > 0:
        raise ValueError("SpecDec++ starts from the prompt: a filled KV cache (cache / past_key_values) is not "
                         "supported")


def generate_from_head(model: PreTrainedModel, *, assistant_model: PreTrainedModel | None = None,
                       streamer: BaseStreamer | None = None,
                       head: AcceptancePredictionHead | str | os.PathLike | None = None, **kwargs
                       ) -> torch.LongTensor | SpeculativeGenerateOutput:
    """What a head folder's `custom_generate/generate.py` runs: load the head from the folder or Hub
    repo that `generate(custom_generate=...)` named (or take `head=`), then run `generate` with
    `hf_generate` as its decoding loop, `assistant_model` as the draft. `kwargs` are `generate`'s
    own arguments (inputs, generation config, `max_new_tokens`, sampling settings, ...), SpecDec++'s
    `stop_threshold`, `bound` and `schedule`, and the Hub options that loaded this file
    (`revision`, `cache_dir`, `token`, ...), which load the head from the same place."""
    hub_options = {k: kwargs.pop(k) for k in HUB_OPTIONS if k in kwargs}  # for loading, not for the models
    if kwargs.get("stop_strings") is not None:
        # generate drops `tokenizer` before it builds the criteria for a callable custom_generate (5.24):
        # the stop strings' criterion is built here, with transformers' own class, as generate builds it
        if kwargs.get("tokenizer") is None:
            raise ValueError("stop_strings needs the model's tokenizer: pass tokenizer=... to generate")
        stop = StopStringCriteria(tokenizer=kwargs.pop("tokenizer"), stop_strings=kwargs.pop("stop_strings"))
        kwargs["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []), stop])
    if head is None or isinstance(head, (str, os.PathLike)):
        location = head or _custom_generate_location()
        if kwargs.get("online") and kwargs.get("estimator") is None:
            kwargs["estimator"] = saved_recalibration(location)
        head = AcceptancePredictionHead.from_pretrained(location, **hub_options)
    decode = functools.partial(hf_generate, draft=assistant_model, head=head, streamer=streamer)
    # GenerationMixin's own generate: `model.generate` may be this very function when the target was
    # loaded from a repo that carries custom_generate/ itself.
    return GenerationMixin.generate(model, custom_generate=decode, **kwargs)


def saved_recalibration(location: str | os.PathLike) -> OnlineAcceptanceEstimator | None:
    """The online recalibration saved in the local head folder `location` (`RECALIBRATION_FILE`,
    written by `OnlineAcceptanceEstimator.save(head_dir)`), or None: a folder without one, or a Hub id."""
    path = os.path.join(location, RECALIBRATION_FILE)
    return OnlineAcceptanceEstimator.load(path) if os.path.isfile(path) else None


def _custom_generate_location() -> str:
    """The folder or Hub id that the running `generate(custom_generate=...)` call named
    (`compat.custom_generate_argument`), or RuntimeError outside such a call."""
    location = custom_generate_argument()
    if location is None:
        raise RuntimeError("no generate(custom_generate=...) call to take the head from: pass head=FOLDER_OR_HUB_ID")
    return location
