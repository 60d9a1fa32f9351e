"""What differs between the `transformers` versions in `setup.py`'s range, and every reach into
transformers beyond its public API, decided here and nowhere else.

The rule (tests/test_compat.py checks it on every module of the package and of benchmarks/): other
modules import from transformers' public API only, the names `transformers` and
`transformers.generation` export (`PreTrainedModel`, `GenerationConfig`, `DynamicCache`,
`LogitsProcessorList`, the processor and criterion classes, ...), and use those objects' public
methods and attributes. Everything else comes through a named function or constant here: names
from deeper modules (`transformers.cache_utils`, `transformers.utils`,
`transformers.generation.<module>`), the cache's layer classes and what a layer can do (which
layers a release has, and their capabilities, change between releases even where the top level
exports them), private names (`_get_logits_processor`, `_is_stateful`, private registries), what
`generate` keeps in its frame, and the version itself. One exception: `train.py` subclasses
`Trainer`, so it overrides Trainer's own hooks and reads the names of the files Trainer writes
(`transformers.trainer`), which only a subclass can do.

transformers 5.24 renamed the KV cache argument `past_key_values` to `cache`: in every model's
`forward`, in the model kwargs `generate` hands a `custom_generate` callable, and in model outputs.
The old name still works until 5.40 but warns on every call. Everything in specdecpp passes and
reads the cache through the functions below, so a model gets the name its own `forward` declares
(remote-code models may keep the old name on a new transformers) and no call of ours warns.
"""
from __future__ import annotations

import functools
import inspect
import os
from typing import Any

import torch
import transformers
from transformers import (DynamicCache, DynamicLayer, GenerationConfig, GenerationMixin, LogitsProcessorList,
                          PreTrainedModel, StaticLayer, StoppingCriteriaList)
from transformers.cache_utils import LinearAttentionCacheLayerMixin
# Re-exported: the base class of our model outputs lives in `transformers.utils`, not at the top level.
from transformers.utils import ModelOutput  # noqa: F401

# The installed version, for messages only: what differs is decided by the capabilities below.
TRANSFORMERS_VERSION = transformers.__version__

# The cache's names, newest first: transformers >= 5.24 and before.
CACHE_NAMES = ("cache", "past_key_values")


def _declared_cache_name(function) -> str | None:
    """The cache keyword `function`'s signature declares (decorators that wrap it are seen through),
    or None when it declares neither name (a forward that takes `**kwargs` only)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in CACHE_NAMES if name in parameters), None)


# What the installed transformers itself calls the cache: its generation code passes it to models
# under this name, so a model whose forward names neither takes this one.
LIBRARY_CACHE_NAME = _declared_cache_name(GenerationMixin.prepare_inputs_for_generation) or CACHE_NAMES[-1]


@functools.cache
def _cache_name_of(model_class: type) -> str:
    return _declared_cache_name(model_class.forward) or LIBRARY_CACHE_NAME


def cache_kwarg(model: Any) -> str:
    """The keyword `model`'s forward takes its KV cache under: `cache` or `past_key_values`
    (decided once per model class from its forward's signature)."""
    return _cache_name_of(type(model))


def cache_kwargs(model: Any, cache: Any) -> dict:
    """`{name: cache}` with the cache keyword `model`'s forward takes, and `use_cache=True`:
    `model(input_ids=..., **cache_kwargs(model, cache))`."""
    return {cache_kwarg(model): cache, "use_cache": True}


def cache_in(kwargs: dict) -> Any:
    """The KV cache a forward's or `generate`'s keyword arguments carry, under either name (None if
    neither is set)."""
    return next((kwargs[name] for name in CACHE_NAMES if kwargs.get(name) is not None), None)


# transformers >= 5.24: a StaticCache layer crops by moving its length counter, which is how the
# compiled engine rolls back (earlier StaticLayers cannot crop at all).
STATIC_CACHE_CROPS = getattr(StaticLayer, "is_croppable", False)


def compile_guarded_state() -> Any:
    """Process-wide state that transformers' forwards read, so that `torch.compile` guards on it: the
    registry of model classes whose outputs can be recorded, which grows whenever a model of a new
    class is built. A compiled graph holds while this value is unchanged (None where it is absent)."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:
        return None
    return frozenset(_CAN_RECORD_REGISTRY)


# -- cache layers ---------------------------------------------------------------------------------
# The layers of plain full attention, `DynamicCache`'s and `StaticCache`'s own. Their subclasses (sliding
# windows) and the linear-attention and quantized layers keep other state.
FULL_ATTENTION_LAYERS = (DynamicLayer, StaticLayer)


def special_layers(cache: Any) -> list:
    """The layers of `cache` (a `DynamicCache` or `StaticCache`) that are not plain full attention
    (sliding-window, linear-attention, quantized, ...), in order; empty when every layer is plain:
    its keys and values then hold the whole context, one entry per token, and crop exactly."""
    return [layer for layer in cache.layers if type(layer) not in FULL_ATTENTION_LAYERS]


def is_sliding(layer: Any) -> bool:
    """Whether a cache layer keeps a sliding window (the layer's `is_sliding`; False for a layer that
    does not say, such as a linear-attention one)."""
    return bool(getattr(layer, "is_sliding", False))


def has_recurrent_state(model: PreTrainedModel) -> bool:
    """Whether `model` carries a recurrent state forward instead of one cache entry per token: a
    stateful model (`_is_stateful`, the state-space models) or one whose cache has linear-attention
    layers. Such a cache cannot forget the tokens a verification rejects."""
    return getattr(model, "_is_stateful", False) or any(
        isinstance(layer, LinearAttentionCacheLayerMixin) for layer in DynamicCache(config=model.config).layers)


# -- models and generate --------------------------------------------------------------------------
def takes_logits_to_keep(model: PreTrainedModel) -> bool:
    """Whether `model`'s forward takes `logits_to_keep` (computing the last positions' logits only),
    as `generate` decides it."""
    return model._supports_logits_to_keep()


def generate_processing(target: PreTrainedModel, config: GenerationConfig, input_ids: torch.LongTensor,
                        logits_processor: LogitsProcessorList, stopping_criteria: StoppingCriteriaList,
                        tokenizer: Any = None) -> tuple[LogitsProcessorList, StoppingCriteriaList]:
    """The logits processors and stopping criteria `target.generate(input_ids, generation_config=config,
    logits_processor=..., stopping_criteria=..., tokenizer=...)` applies, built by `generate`'s own
    (private) builders after its preparation of the special tokens, which writes them into `config`
    as tensors: pass a copy."""
    target._prepare_special_tokens(config, kwargs_has_attention_mask=True, device=target.device, batch_size=1)
    processors = target._get_logits_processor(
        generation_config=config, input_ids_seq_length=input_ids.shape[-1], encoder_input_ids=input_ids,
        logits_processor=logits_processor, device=target.device)
    return processors, target._get_stopping_criteria(config, stopping_criteria, tokenizer)


def custom_generate_argument() -> str | None:
    """The folder or Hub id that the running `generate(custom_generate=...)` call named, read from
    `generate`'s frame (its local `custom_generate`), or None outside such a call. transformers runs
    a copy of the named repo's `generate.py` from its modules cache, so that file cannot find its
    folder from its own path."""
    frame = inspect.currentframe()
    while frame is not None:
        location = frame.f_locals.get("custom_generate") if frame.f_code.co_name == "generate" else None
        if isinstance(location, (str, os.PathLike)):
            return str(location)
        frame = frame.f_back
    return None
