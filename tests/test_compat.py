"""The transformers cache keyword, decided in one place, and the guard that turns our deprecated
calls into errors (tests/conftest.py)."""
from __future__ import annotations

import warnings

import pytest
import torch
from transformers import DynamicCache
from transformers.utils.deprecation import deprecate_kwarg

from conftest import OurDeprecatedCall, tiny_llama
from specdecpp import compat
from specdecpp.engine.decoding import CachedModel
from specdecpp.evaluation.hf_baselines import count_forwards, rounds_from_target_calls


class OldNamed(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=None):
        return input_ids


class NewNamed(torch.nn.Module):
    def forward(self, input_ids, cache=None, use_cache=None):
        return input_ids


class KwargsOnly(torch.nn.Module):
    def forward(self, input_ids, **kwargs):
        return input_ids


def test_each_model_gets_the_cache_keyword_its_forward_declares():
    assert compat.cache_kwarg(OldNamed()) == "past_key_values"
    assert compat.cache_kwarg(NewNamed()) == "cache"
    assert compat.cache_kwarg(KwargsOnly()) == compat.LIBRARY_CACHE_NAME
    assert compat.cache_kwarg(tiny_llama()) == compat.LIBRARY_CACHE_NAME  # the installed library's own models
    assert compat.cache_kwargs(NewNamed(), "c") == {"cache": "c", "use_cache": True}


def test_a_cache_is_found_under_either_name():
    assert compat.cache_in({"cache": 1}) == compat.cache_in({"past_key_values": 1}) == 1
    assert compat.cache_in({"cache": None, "past_key_values": 2}) == 2
    assert compat.cache_in({"attention_mask": 1}) is None


class FakeCache:
    def __init__(self, length: int):
        self.length = length

    def get_seq_length(self) -> int:
        return self.length


@pytest.mark.parametrize("name", compat.CACHE_NAMES)
def test_count_forwards_reads_the_cache_under_either_keyword(name):
    model = KwargsOnly()
    with count_forwards(model) as calls:
        model(input_ids=torch.zeros(1, 11, dtype=torch.long), **{name: FakeCache(0)})
        model(input_ids=torch.zeros(1, 5, dtype=torch.long), **{name: FakeCache(8)})
        model(torch.zeros(1, 5, dtype=torch.long), **{name: FakeCache(9)})
    assert calls == [(11, 0), (5, 8), (5, 9)]
    assert rounds_from_target_calls(calls, prompt_length=7, generated=5) == ([1, 0, 1], [4, 4, 4])


@pytest.mark.parametrize("calls, generated, problem", [
    ([(11, 0), (5, 0), (5, 0)], 6, "only the first forward may start from an empty cache"),  # the cache unseen
    ([(11, 8), (5, 9)], 6, "only the first forward may start from an empty cache"),
    ([(11, 0), (5, 9), (5, 8)], 6, "round 1: -1 tokens emitted"),  # a round start goes back
    ([(11, 0), (3, 14)], 9, "round 0: 8 tokens emitted"),  # more accepted than drafted
    ([(11, 0), (5, 8)], 40, "round 1: 38 tokens emitted"),  # the rounds do not add up to the generation
    ([], 3, "no target forward"),
])
def test_impossible_rounds_are_an_error(calls, generated, problem):
    with pytest.raises(ValueError, match=problem):
        rounds_from_target_calls(calls, prompt_length=7, generated=generated)


def test_the_engine_calls_the_models_without_deprecation_warnings():
    model = CachedModel(tiny_llama())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.forward([1, 2, 3, 4], num_logits=1)
        model.forward([1, 2, 3, 4, 5, 6], num_logits=2, hidden=True)
    assert model.cache.get_seq_length() == 6


def _call_from_our_package(function, **kwargs):
    """Call `function(**kwargs)` from a frame that belongs to the specdecpp package, as library code would."""
    scope = {"__name__": "specdecpp.somewhere", "function": function, "kwargs": kwargs}
    exec(compile("result = function(**kwargs)", "specdecpp/somewhere.py", "exec"), scope)
    return scope["result"]


def test_a_transformers_deprecation_caused_by_our_code_fails_the_suite():
    @deprecate_kwarg("old_name", "99.0.0", new_name="new_name")
    def renamed(new_name=None):
        return new_name

    with pytest.raises(OurDeprecatedCall, match="old_name"):
        _call_from_our_package(renamed, old_name=1)
    assert _call_from_our_package(renamed, new_name=1) == 1
    with pytest.warns(FutureWarning):  # the same call from outside our package only warns
        renamed(old_name=1)


@pytest.mark.skipif(compat.LIBRARY_CACHE_NAME != "cache", reason="this transformers has not renamed the cache yet")
def test_the_old_cache_keyword_from_our_code_fails_the_suite():
    model = tiny_llama()
    with pytest.raises(OurDeprecatedCall, match="past_key_values"):
        _call_from_our_package(model, input_ids=torch.tensor([[1, 2]]),
                               past_key_values=DynamicCache(config=model.config), use_cache=True)
