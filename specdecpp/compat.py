"""Every `transformers` version difference and reach beyond its public API, decided here only (docs/design.md)."""
from __future__ import annotations

import functools
import inspect
import os
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers import (DynamicCache, DynamicLayer, GenerationConfig, GenerationMixin, LogitsProcessorList,
                          PreTrainedModel, StaticLayer, StoppingCriteriaList)
from transformers.cache_utils import LinearAttentionCacheLayerMixin
from transformers.utils import ModelOutput  # noqa: F401  (re-exported)

TRANSFORMERS_VERSION = transformers.__version__

CACHE_NAMES = ("cache", "past_key_values")  # transformers >= 5.24, and before


def _declared_cache_name(function) -> str | None:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in CACHE_NAMES if name in parameters), None)


# What transformers' generation code calls the cache, for a model whose forward names neither.
LIBRARY_CACHE_NAME = _declared_cache_name(GenerationMixin.prepare_inputs_for_generation) or CACHE_NAMES[-1]


@functools.cache
def _cache_name_of(model_class: type) -> str:
    return _declared_cache_name(model_class.forward) or LIBRARY_CACHE_NAME


def cache_kwarg(model: Any) -> str:
    """The keyword `model`'s forward takes its KV cache under (decided once per model class)."""
    return _cache_name_of(type(model))


def cache_kwargs(model: Any, cache: Any) -> dict:
    """`{cache keyword: cache, "use_cache": True}` for `model(input_ids=..., **cache_kwargs(model, cache))`."""
    return {cache_kwarg(model): cache, "use_cache": True}


def cache_in(kwargs: dict) -> Any:
    """The KV cache keyword arguments carry under either name, or None."""
    return next((kwargs[name] for name in CACHE_NAMES if kwargs.get(name) is not None), None)


STATIC_CACHE_CROPS = getattr(StaticLayer, "is_croppable", False)  # transformers >= 5.24


def _graph_guards(entries: list) -> list[bool]:
    """torch's portable guards (tensors, shapes and the global context: grad mode, autocast) less the parameters'."""
    portable = torch.compiler.keep_portable_guards_unsafe(entries)
    return [keep and not isinstance(entry.value, torch.nn.Parameter) for keep, entry in zip(portable, entries)]


# What the compiled engine's graphs check before each call: their inputs, the cache's tensors and the global context.
# Models and cache objects stay as built (a model cast or moved gets a new engine), and the state transformers'
# forwards read besides is `compile_guarded_state`, checked by the engine. None (every guard) where torch has no filter.
COMPILE_GUARD_FILTER = _graph_guards if hasattr(torch.compiler, "keep_portable_guards_unsafe") else None


def compile_guarded_state() -> Any:
    """Process-wide state transformers' forwards read: compiled graphs hold while it is unchanged."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:
        return None
    return frozenset(_CAN_RECORD_REGISTRY)


# Plain full attention; subclasses (sliding windows), linear-attention and quantized layers keep other state.
FULL_ATTENTION_LAYERS = (DynamicLayer, StaticLayer)


def special_layers(cache: Any) -> list:
    """The layers of `cache` that are not plain full attention (sliding-window, linear-attention, ...)."""
    return [layer for layer in cache.layers if type(layer) not in FULL_ATTENTION_LAYERS]


def copy_static_cache(source: Any, target: Any, length: int) -> None:
    """Make `target`, a `StaticCache` of the same model, hold `source`'s first `length` entries (in place)."""
    for src, dst in zip(source.layers, target.layers):
        dst.keys[:, :, :length].copy_(src.keys[:, :, :length])
        dst.values[:, :, :length].copy_(src.values[:, :, :length])
        dst.cumulative_length.fill_(length)


def is_sliding(layer: Any) -> bool:
    return bool(getattr(layer, "is_sliding", False))


# Sliding-window caches roll back from transformers 5.18 (5.14 cannot crop them, 5.15-5.17 mis-size the masks).
SLIDING_WINDOW_ROLLS_BACK = Version(TRANSFORMERS_VERSION).release >= (5, 18)


def move_cache_positions(cache: Any, start: int, sources: list[int]) -> None:
    """Copy a full-attention `cache`'s keys and values at positions `sources` to `start, start + 1, ...`."""
    if not sources:
        return
    for layer in cache.layers:
        index = torch.tensor(sources, device=layer.keys.device)
        for tensor in (layer.keys, layer.values):
            tensor[:, :, start:start + len(sources)] = tensor.index_select(2, index)


def has_sliding_window(model: PreTrainedModel) -> bool:
    """Whether `model`'s cache has sliding-window layers."""
    return any(is_sliding(layer) for layer in DynamicCache(config=model.config).layers)


def has_recurrent_state(model: PreTrainedModel) -> bool:
    """Whether `model` carries a recurrent state, which cannot forget rejected tokens."""
    return getattr(model, "_is_stateful", False) or any(
        isinstance(layer, LinearAttentionCacheLayerMixin) for layer in DynamicCache(config=model.config).layers)


def takes_logits_to_keep(model: PreTrainedModel) -> bool:
    """Whether `model`'s forward takes `logits_to_keep`, as `generate` decides it."""
    return model._supports_logits_to_keep()


def generate_processing(target: PreTrainedModel, config: GenerationConfig, input_ids: torch.LongTensor,
                        logits_processor: LogitsProcessorList, stopping_criteria: StoppingCriteriaList,
                        tokenizer: Any = None) -> tuple[LogitsProcessorList, StoppingCriteriaList]:
    """The logits processors and stopping criteria `generate` builds; `config` is written to: pass a copy."""
    target._prepare_special_tokens(config, kwargs_has_attention_mask=True, device=target.device, batch_size=1)
    processors = target._get_logits_processor(
        generation_config=config, input_ids_seq_length=input_ids.shape[-1], encoder_input_ids=input_ids,
        logits_processor=logits_processor, device=target.device)
    return processors, target._get_stopping_criteria(config, stopping_criteria, tokenizer)


def custom_generate_argument() -> str | None:
    """The folder or Hub id the running `generate(custom_generate=...)` call named, read from its frame, or None."""
    frame = inspect.currentframe()
    while frame is not None:
        location = frame.f_locals.get("custom_generate") if frame.f_code.co_name == "generate" else None
        if isinstance(location, (str, os.PathLike)):
            return str(location)
        frame = frame.f_back
    return None
