"""What differs between the `transformers` versions in `setup.py`'s range, decided here and nowhere else.

transformers 5.24 renamed the KV cache argument `past_key_values` to `cache`: in every model's
`forward`, in the model kwargs `generate` hands a `custom_generate` callable, and in model outputs.
The old name still works until 5.40 but warns on every call. Everything in specdecpp passes and
reads the cache through the functions below, so a model gets the name its own `forward` declares
(remote-code models may keep the old name on a new transformers) and no call of ours warns.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

from transformers import GenerationMixin
from transformers.cache_utils import StaticLayer

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
