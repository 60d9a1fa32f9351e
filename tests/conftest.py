"""Shared fixtures: tiny random models built from configs (nothing is downloaded)."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

# Tiny models gain nothing from intra-op threads, and on a shared 2-core machine threads thrash.
torch.set_num_threads(1)


# -- the next rename fails a test the day it ships -------------------------------------------------
# transformers and torch announce a rename with a FutureWarning or DeprecationWarning raised inside
# their own code (attributed to whatever called them, often torch's module machinery), so a filter by
# module cannot see that our package made the call. This guard looks at the stack instead: such a
# warning is an error when the first caller outside those libraries (and the standard helpers they
# call through) is specdecpp. A deprecated call that another package (peft, ...) makes is its own.
DEPRECATIONS = (FutureWarning, DeprecationWarning)
LIBRARIES = ("transformers", "torch")
PASS_THROUGH = LIBRARIES + ("functools", "contextlib")


class OurDeprecatedCall(Exception):
    """A transformers or torch deprecation warning caused by a call from specdecpp."""


def _package_of(frame) -> str:
    return (frame.f_globals.get("__name__", "") or "").split(".")[0]


def _guarded_warn(message, category=None, stacklevel=1, source=None, **kwargs):
    category = category or (type(message) if isinstance(message, Warning) else UserWarning)
    frame = sys._getframe(1)
    if issubclass(category, DEPRECATIONS) and _package_of(frame) in LIBRARIES:
        while frame is not None and _package_of(frame) in PASS_THROUGH:
            frame = frame.f_back
        if frame is not None and _package_of(frame) == "specdecpp":
            raise OurDeprecatedCall(f"{frame.f_globals['__name__']} ({frame.f_code.co_filename}:{frame.f_lineno}) "
                                    f"calls a deprecated transformers/torch API: {category.__name__}: {message}")
    return _unguarded_warn(message, category, stacklevel + 1, source, **kwargs)


_unguarded_warn = warnings.warn
warnings.warn = _guarded_warn


# -- no test leaves torch's compiler configuration changed ----------------------------------------
# torch._dynamo.config is process-wide: a test that leaves an entry changed changes every later compile,
# and one that deletes an entry hides it, so every later compile fails ("... does not exist"). pytest >=
# 9.2's monkeypatch.setattr undoes by deleting on torch's config modules; use torch's config.patch(...).
@pytest.fixture(autouse=True)
def _dynamo_config_left_as_found():
    config = torch._dynamo.config
    before = config.get_config_copy()
    yield
    after = config.get_config_copy()
    changed = [name for name, value in before.items() if after[name] != value]
    # A hidden entry still shows its default in the copy; only reading it, as torch does, fails.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # reading a deprecated entry warns
        hidden = [name for name in before if not hasattr(config, name)]
    if changed or hidden:
        for name in changed + hidden:  # put it back, so that the tests after this one are not failed too
            setattr(config, name, before[name])
        left = [f"{name} changed" for name in changed] + [f"{name} hidden (deleted)" for name in hidden]
        pytest.fail(f"the test left torch._dynamo.config with {', '.join(left)}: patch it with "
                    f"torch._dynamo.config.patch(...), which puts it back as it was")


def tiny_llama(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2, seed: int = 0,
               dtype: torch.dtype = torch.float64, initializer_range: float = 0.3) -> LlamaForCausalLM:
    """A tiny random Llama in eval mode. A wide initializer makes the logits peaked enough that
    greedy runs are not all one token, and float64 keeps rounding from flipping argmax ties."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=initializer_range,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).to(dtype).eval()


def tiny_recurrent(kind: str = "jamba", vocab_size: int = 64, seed: int = 0):
    """A tiny random model with recurrent layers, whose cache cannot be rolled back: `jamba`
    (mamba and attention layers) or `mamba` (state-space only)."""
    from transformers import AutoModelForCausalLM, JambaConfig, MambaConfig

    torch.manual_seed(seed)
    config = (JambaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
                          expert_layer_period=100, num_experts=1, bos_token_id=None, eos_token_id=None,
                          pad_token_id=None) if kind == "jamba"
              else MambaConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, bos_token_id=None,
                               eos_token_id=None, pad_token_id=None))
    return AutoModelForCausalLM.from_config(config).to(torch.float64).eval()


def perturbed_copy(model: LlamaForCausalLM, noise: float, seed: int = 1) -> LlamaForCausalLM:
    """A draft that agrees with `model` often but not always: its weights plus Gaussian noise."""
    draft = LlamaForCausalLM(model.config).to(model.dtype).eval()
    draft.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return draft


HIDDEN = 32  # tiny_llama's hidden size
VOCAB = 6  # small_vocab_pair's vocabulary
ZOO_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "zoo"


def randomized(head):
    """`head` with every weight drawn from N(0, 0.5^2), from torch's global generator."""
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.5)
    return head


@pytest.fixture(scope="module")
def random_head():
    """A reader head with random weights on `tiny_llama`'s hidden states."""
    from specdecpp import AcceptancePredictionHead

    torch.manual_seed(3)
    return randomized(AcceptancePredictionHead(HIDDEN, num_layers=2))


@pytest.fixture(scope="module")
def small_vocab_pair():
    """A tiny-vocabulary target and an unrelated draft, so rejections and residual draws are common."""
    return (tiny_llama(vocab_size=VOCAB, seed=0, initializer_range=0.5),
            tiny_llama(vocab_size=VOCAB, seed=5, initializer_range=0.5))


@pytest.fixture(scope="module")
def zoo():
    """(target, draft, tokenizer) of the committed pair, float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(ZOO_DIR / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(ZOO_DIR / "draft", dtype=torch.float32).eval()
    return target, draft, AutoTokenizer.from_pretrained(ZOO_DIR / "target")


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft): a 2-layer target and a noisy copy of it as the draft, float64."""
    target = tiny_llama(seed=0)
    return target, perturbed_copy(target, noise=0.01)


# -- appended for the data builder, training and calibration tests ------------------------------
WORDS = ("the a of to and in is it that for on with as was at by an be this are or from but not have "
         "one all were we when there can more if out so up what about into than them only other new some "
         "could time these two may then do first any my now such like our over man me even most").split()[:60]


def tiny_tokenizer():
    """A 64-token word-level tokenizer (`<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3, then 60 words) that
    prepends BOS, matching `tiny_llama`'s default vocabulary; built in memory, nothing downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def write_prompts(path, n: int, seed: int = 0, min_words: int = 2, max_words: int = 9) -> str:
    """A JSONL prompt file of `n` random word sequences of varied lengths (so batches need padding)."""
    import json
    import random

    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt": " ".join(rng.choices(WORDS, k=rng.randint(min_words, max_words)))}) + "\n")
    return str(path)


@pytest.fixture(scope="session")
def pair_dirs(tmp_path_factory, tiny_pair):
    """`(target_dir, draft_dir)`: `tiny_pair` saved as model folders with `tiny_tokenizer`, as a
    user's checkpoints would be."""
    root = tmp_path_factory.mktemp("pair")
    dirs = []
    for name, model in zip(("target", "draft"), tiny_pair):
        model.save_pretrained(root / name)
        tiny_tokenizer().save_pretrained(root / name)
        dirs.append(str(root / name))
    return tuple(dirs)


def free_port() -> int:
    """A TCP port nothing listens on now, for a torchrun test's rendezvous (a fixed one may be taken)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True, scope="session")
def _step_times_kept_apart(tmp_path_factory):
    """Step times that `auto` measures are kept in a folder of the run's own, not the user's cache."""
    from specdecpp.measuring import step_timing
    step_timing.STEP_TIMES_CACHE = tmp_path_factory.mktemp("step_times")
