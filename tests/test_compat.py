"""The transformers cache keyword, decided in one place, the guard that turns our deprecated
calls into errors (tests/conftest.py), and no reach into transformers' internals outside compat."""
from __future__ import annotations

import ast
import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin
from transformers.utils.deprecation import deprecate_kwarg

from conftest import OurDeprecatedCall, tiny_llama
from specdecpp import compat
from specdecpp.engine.draft_step import CachedModel
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
        model.forward([1, 2, 3, 4, 5, 6], num_logits=2, with_hidden_states=True)
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


# -- the rule in specdecpp/compat.py's docstring ------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
# Where other modules may import transformers names from: its public API.
PUBLIC_MODULES = {"transformers", "transformers.generation"}
# train.py subclasses Trainer: it reads the names of the files Trainer writes, as only its subclass needs to.
ALLOWED_ELSEWHERE = {"specdecpp/train.py": {"transformers.trainer", "transformers.trainer_utils"}}
# The cache's layer classes (exported at the top level or not): which exist, and what each can do, is compat's.
CACHE_LAYERS = {name for name, value in vars(transformers.cache_utils).items()
                if isinstance(value, type) and issubclass(value, (CacheLayerMixin, LinearAttentionCacheLayerMixin))}
# The private attributes of the transformers classes the package handles (models and generate, configs,
# caches and their layers), less torch's own (a model is an nn.Module).
PRIVATE_NAMES = {name for cls in (transformers.PreTrainedModel, transformers.GenerationMixin,
                                  transformers.GenerationConfig, transformers.PretrainedConfig,
                                  transformers.DynamicCache, transformers.StaticCache,
                                  *(getattr(transformers.cache_utils, layer) for layer in CACHE_LAYERS))
                 for name in dir(cls) if name.startswith("_") and not name.startswith("__")} - set(dir(torch.nn.Module))


def _submodule(package: str, name: str) -> bool:
    """Whether `package.name` is a module of its own outside `PUBLIC_MODULES` rather than a name `package` exports."""
    return f"{package}.{name}" not in PUBLIC_MODULES and importlib.util.find_spec(f"{package}.{name}") is not None


def _own(node: ast.expr) -> bool:
    """Whether an attribute is read from the object's own class: `self.x`, `cls.x`, `super().x`."""
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super")


def transformers_internals(source: str, allowed_modules: set[str] = frozenset()) -> list[str]:
    """What `source` takes from transformers beyond its public API, each as `LINE: what`: imports from
    modules outside `PUBLIC_MODULES` (and `allowed_modules`), private names, the cache's layer classes, the
    version (`transformers.__version__`, `version("transformers")`) and private attributes of transformers'
    objects, read directly or through `getattr`/`hasattr` (an attribute of `self`, `cls` or `super()` is the
    class's own)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names if alias.name.startswith("transformers.")]
            what = next((f"import {m}" for m in modules if m not in PUBLIC_MODULES | allowed_modules), None)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] == "transformers":
            names = [alias.name for alias in node.names]
            if node.module not in PUBLIC_MODULES | allowed_modules:
                what = f"from {node.module} import"
            elif bad := [n for n in names if n.startswith("_") or n in CACHE_LAYERS
                         or (node.module in PUBLIC_MODULES and _submodule(node.module, n))]:
                what = f"from {node.module} import {', '.join(bad)}"
        elif isinstance(node, ast.Attribute) and not _own(node.value):
            on_package = isinstance(node.value, ast.Name) and node.value.id == "transformers"
            if node.attr in PRIVATE_NAMES or (on_package and (node.attr.startswith("_") or node.attr in CACHE_LAYERS
                                                               or _submodule("transformers", node.attr))):
                what = f".{node.attr}"
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr") and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in PRIVATE_NAMES and not _own(node.args[0]):
            what = f"{node.func.id}(..., {node.args[1].value!r})"
        elif isinstance(node, ast.Call) and any(isinstance(arg, ast.Constant) and arg.value == "transformers"
                                                for arg in node.args) and "version" in ast.unparse(node.func):
            what = ast.unparse(node)
        if what:
            found.append((node.lineno, what))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_the_check_sees_each_kind_of_internal():
    source = ("import transformers.cache_utils\nfrom transformers.utils import ModelOutput\n"
              "from transformers.generation import logits_process as lp\nfrom transformers import DynamicLayer, utils\n"
              "v = transformers.__version__\nmodel._supports_logits_to_keep()\ngetattr(model, '_is_stateful', False)\n"
              "transformers.StaticLayer\nimportlib.metadata.version('transformers')\n"
              "from transformers import GenerationConfig, LogitsProcessorList, logging\n"
              "from transformers.generation import BaseStreamer\nself._get_logits_processor()\n"
              "super()._from_pretrained()\nestimator._add()\ngetattr(model, 'generation_config', None)\n")
    assert [line.split(":")[0] for line in transformers_internals(source)] == [str(n) for n in range(1, 10)]
    assert transformers_internals("from transformers.trainer import TRAINER_STATE_NAME\n",
                                  {"transformers.trainer"}) == []


@pytest.mark.parametrize("path", sorted(str(path.relative_to(ROOT)) for folder in ("specdecpp", "benchmarks")
                                        for path in (ROOT / folder).rglob("*.py") if path.name != "compat.py"))
def test_only_compat_reaches_into_transformers(path):
    found = transformers_internals((ROOT / path).read_text(encoding="utf-8"), ALLOWED_ELSEWHERE.get(path, set()))
    assert not found, f"{path} reaches into transformers (put it behind specdecpp.compat): {found}"
