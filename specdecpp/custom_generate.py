"""The public ways to decode: `speculative_generate`, and SpecDec++ from `transformers`' own `generate`:
`custom_generate=HEAD_FOLDER_OR_REPO` (runs `generate_from_head`), or `custom_generate=specdecpp.hf_generate`
with `draft=` and `head=`; all price `"auto"` for this processor (`auto_priced`)."""
from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass, fields, replace

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation import (BaseStreamer, GenerateDecoderOnlyOutput, LogitsProcessorList, StoppingCriteriaList,
                                     StopStringCriteria)

from specdecpp.compat import CACHE_NAMES, cache_in, custom_generate_argument
from specdecpp.engine.decoding import GenerationStats, SpeculativeOutput, decode
from specdecpp.engine.online import RECALIBRATION_FILE, OnlineAcceptanceEstimator
from specdecpp.engine.processing import CRITERIA_FIELDS, PROCESSOR_FIELDS, Processing
from specdecpp.engine.settings import DecodingSettings, default_schedule
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.costs import StepTimes
from specdecpp.measuring.step_timing import auto_step_times, device_step_times

# What `generate` prepares that the loop may ignore: it keeps its own caches and gets the built criteria.
IGNORED_MODEL_KWARGS = {"position_ids", "cache_position", "logits_to_keep", "use_cache", "tokenizer", *CACHE_NAMES}
HUB_OPTIONS = ("revision", "cache_dir", "force_download", "local_files_only", "token")


def _signature_from_settings(function):
    """`function`'s signature with `DecodingSettings`' fields (and defaults) as keyword arguments."""
    signature = inspect.signature(function)
    *own, _ = signature.parameters.values()
    keyword = inspect.Parameter.KEYWORD_ONLY
    knobs = [inspect.Parameter(f.name, keyword, default=f.default, annotation=f.type) for f in fields(DecodingSettings)
             if f.name not in PROCESSOR_FIELDS + CRITERIA_FIELDS]
    rest = inspect.Parameter("processing_fields", inspect.Parameter.VAR_KEYWORD)
    function.__signature__ = signature.replace(parameters=[*own, *knobs, rest])
    return function


@_signature_from_settings
def speculative_generate(target: PreTrainedModel, draft: PreTrainedModel | None, input_ids: torch.LongTensor, *,
                         attention_mask: torch.Tensor | None = None, generator: torch.Generator | None = None,
                         streamer=None, tokenizer=None, **settings) -> SpeculativeOutput:
    """Generate from `target` (batch size 1, no padding) with `draft` proposing under `DecodingSettings`' fields.
    Greedy output equals `target.generate`'s token for token; sampled output follows its distribution."""
    return decode(target, draft, input_ids, auto_priced(DecodingSettings(**settings), target, draft),
                  attention_mask=attention_mask, generator=generator, streamer=streamer, tokenizer=tokenizer)


def auto_priced(settings: DecodingSettings, target: PreTrainedModel, draft: PreTrainedModel | None) -> DecodingSettings:
    """`settings` with the head's defaults and, unless `step_times` are given, this processor's step times (timed
    once and kept) where an `auto`-sized `ada-tree` or an `ada` `"auto"` threshold needs them."""
    if settings.schedule is None:
        settings = replace(settings, schedule=default_schedule(draft, settings.head))
    settings = settings.with_head_defaults()
    if settings.step_times is not None or settings.head is None or draft is None:
        return settings
    if settings.schedule == "ada-tree" and settings.tree_nodes == "auto":
        return replace(settings, step_times=device_step_times(target, draft, settings.head, settings.compile,
                                                              tree_width=settings.tree_width))
    if settings.schedule in ("ada", "ada-tree") and settings.stop_threshold == "auto" \
            and settings.head.stop_threshold is not None:
        return replace(settings, step_times=auto_step_times(settings.head, target, draft, settings.compile))
    return settings


@dataclass
class SpeculativeGenerateOutput(GenerateDecoderOnlyOutput):
    """`generate`'s `GenerateDecoderOnlyOutput` plus `stats` (a `GenerationStats`)."""

    stats: GenerationStats | None = None


def hf_generate(model: PreTrainedModel, input_ids: torch.LongTensor,
                logits_processor: LogitsProcessorList | None = None,
                stopping_criteria: StoppingCriteriaList | None = None,
                generation_config: GenerationConfig | None = None, synced_gpus: bool = False,
                streamer: BaseStreamer | None = None, *, draft: PreTrainedModel | None = None,
                head: AcceptancePredictionHead | str | os.PathLike | None = None, schedule: str | None = None,
                stop_threshold: float | str | None = None, bound: tuple[int, int] | None = None, compile: bool = False,
                online: bool = False, estimator: OnlineAcceptanceEstimator | None = None,
                step_times: StepTimes | None = None, tree_nodes: int | str | None = None, tree_width: int | None = None,
                **model_kwargs) -> torch.LongTensor | SpeculativeGenerateOutput:
    """The SpecDec++ loop as a `custom_generate` callable; `head` is a head or a folder / Hub id (see `auto_priced`)."""
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
    eos = config.eos_token_id
    settings = DecodingSettings(
        schedule=schedule, head=head, max_new_tokens=int(config.max_length) - input_ids.shape[-1],
        do_sample=bool(config.do_sample), temperature=1.0 if config.temperature is None else config.temperature,
        top_k=config.top_k or 0, top_p=1.0 if config.top_p is None else config.top_p,
        eos_token_id=[] if eos is None else eos, num_assistant_tokens=config.num_assistant_tokens,
        assistant_confidence_threshold=config.assistant_confidence_threshold, compile=compile, online=online,
        estimator=estimator, step_times=step_times, stop_threshold=stop_threshold,
        bound=tuple(bound) if bound is not None else None,
        **{name: value for name, value in (("tree_nodes", tree_nodes), ("tree_width", tree_width)) if value is not None},
        **{name: getattr(config, name) for name in PROCESSOR_FIELDS})
    out = decode(model, draft, input_ids, auto_priced(settings, model, draft),
                 attention_mask=model_kwargs.get("attention_mask"), streamer=streamer, processing=processing)
    if config.return_dict_in_generate:
        return SpeculativeGenerateOutput(sequences=out.sequences, stats=out.stats)
    return out.sequences


def _check_generate_settings(config: GenerationConfig, model_kwargs: dict) -> None:
    """ValueError for what `generate` was asked that the loop would not honour."""
    if (config.num_beams or 1) > 1 or (config.num_return_sequences or 1) > 1:
        raise ValueError("SpecDec++ decodes one sequence: num_beams and num_return_sequences must be 1")
    outputs = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
    if extra_outputs := [name for name in outputs if config.return_dict_in_generate and getattr(config, name, False)]:
        raise ValueError(f"SpecDec++ returns the sequences (and stats) only, not {', '.join(extra_outputs)}")
    if unknown := sorted(set(model_kwargs) - IGNORED_MODEL_KWARGS - {"attention_mask"}):
        raise ValueError(f"SpecDec++ cannot pass {', '.join(unknown)} to the models")
    if (cache := cache_in(model_kwargs)) is not None and cache.get_seq_length() > 0:
        raise ValueError("SpecDec++ starts from the prompt: a filled KV cache (cache / past_key_values) is not "
                         "supported")


def generate_from_head(model: PreTrainedModel, *, assistant_model: PreTrainedModel | None = None,
                       streamer: BaseStreamer | None = None,
                       head: AcceptancePredictionHead | str | os.PathLike | None = None, **kwargs
                       ) -> torch.LongTensor | SpeculativeGenerateOutput:
    """What a head folder's `custom_generate/generate.py` runs: `generate` with `hf_generate` and that folder's head."""
    hub_options = {k: kwargs.pop(k) for k in HUB_OPTIONS if k in kwargs}  # for loading, not for the models
    if kwargs.get("stop_strings") is not None:
        # generate drops `tokenizer` before building the criteria for a callable custom_generate
        if kwargs.get("tokenizer") is None:
            raise ValueError("stop_strings needs the model's tokenizer: pass tokenizer=... to generate")
        stop = StopStringCriteria(tokenizer=kwargs.pop("tokenizer"), stop_strings=kwargs.pop("stop_strings"))
        kwargs["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []), stop])
    if head is None or isinstance(head, (str, os.PathLike)):
        location = head or custom_generate_argument()
        if location is None:
            raise RuntimeError("no generate(custom_generate=...) call to take the head from: "
                               "pass head=FOLDER_OR_HUB_ID")
        if kwargs.get("online") and kwargs.get("estimator") is None:
            kwargs["estimator"] = saved_recalibration(location)
        head = AcceptancePredictionHead.from_pretrained(location, **hub_options)
    decode = functools.partial(hf_generate, draft=assistant_model, head=head, streamer=streamer)
    # `model.generate` may be this very function when the target's repo carries custom_generate/
    return GenerationMixin.generate(model, custom_generate=decode, **kwargs)


def saved_recalibration(location: str | os.PathLike) -> OnlineAcceptanceEstimator | None:
    """The online recalibration saved in the local head folder `location`, or None."""
    path = os.path.join(location, RECALIBRATION_FILE)
    return OnlineAcceptanceEstimator.load(path) if os.path.isfile(path) else None
