"""Loading models, tokenizers and heads from Hub ids, folders and PEFT adapter folders (merged into their base)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from glob import glob

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specdecpp import checks
from specdecpp.checks import is_peft_adapter, peft_base, vocab_size
from specdecpp.cli import common_field, option
from specdecpp.head.model import AcceptancePredictionHead

DTYPES = {"auto": "auto", "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class PairArguments:
    """The pair a command works on and how it loads it, under the same flags in every command."""

    target: str | None = common_field("target", default=None, help="the target: Hub id, folder, or PEFT adapter folder")
    draft: str | None = common_field("draft", default=None, help="the draft: Hub id, folder, or PEFT adapter folder")
    torch_dtype: str | None = option(None, f"dtype passed to from_pretrained: one of {', '.join(DTYPES)} (default: "
        "the checkpoint's own, except that a float16/bfloat16 checkpoint loaded onto a CPU runs in float32)")
    device: str | None = common_field("device", default=None, help=(
        "from_pretrained's device_map: a device (cpu, cuda:1) or 'auto' (default: one GPU per rank where there are)"))
    trust_remote_code: bool = option(False, "allow models whose code lives in their Hub repo (off unless you trust it)")

    def require(self, *roles: str) -> PairArguments:
        """ValueError naming the flags unless every one of `roles` is given; returns the arguments."""
        if missing := [f"--{role}" for role in roles if not getattr(self, role)]:
            raise ValueError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")
        return self

    def loading(self) -> dict:
        """The loading options as `load_model`'s keyword arguments."""
        return {"torch_dtype": self.torch_dtype, "device_map": self.device, "trust_remote_code": self.trust_remote_code}


@dataclass
class HeadPairArguments(PairArguments):
    """The pair and its acceptance prediction head(s), `--head`: for the commands that read a head."""

    head: list[str] = common_field("head", default_factory=list, help="a head folder or Hub id (several for evaluate)")

    def single_head(self) -> str | None:
        """The one head given (None without one); ValueError for several."""
        if len(self.head) > 1:
            raise ValueError(f"this command takes one --head, got {len(self.head)}: {' '.join(self.head)}")
        return self.head[0] if self.head else None


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | str | None:
    """`'bfloat16'` -> `torch.bfloat16` (`'auto'`, None and dtypes pass through), else ValueError."""
    if name is None or isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown torch_dtype {name!r}; choose from {', '.join(DTYPES)}")
    return DTYPES[name]


def load_model(name_or_path: str, torch_dtype: str | torch.dtype | None = None, device_map: str | dict | None = None,
               trust_remote_code: bool = False) -> PreTrainedModel:
    """A causal LM in eval mode; a PEFT adapter folder is merged into the base it names."""
    kwargs = {"dtype": parse_dtype(torch_dtype), "device_map": device_map, "trust_remote_code": trust_remote_code}
    if is_peft_adapter(name_or_path):
        from peft import PeftModel

        base = peft_base(name_or_path)
        with naming_damaged_weights(base, name_or_path):
            model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, **kwargs), name_or_path)
        model = model.merge_and_unload()
    else:
        with naming_damaged_weights(name_or_path):
            model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    if torch_dtype is None and model_device(model).type == "cpu" and model.dtype in (torch.float16, torch.bfloat16):
        # a half-precision checkpoint runs slowly on a CPU and rounds near-ties unlike float32
        model = model.float()
    return model.eval()


def load_head(name_or_path: str) -> AcceptancePredictionHead:
    """`AcceptancePredictionHead.from_pretrained`, a local folder checked to be a head first."""
    if os.path.isdir(name_or_path):
        checks.read_head_config(name_or_path)
    with naming_damaged_weights(name_or_path):
        return AcceptancePredictionHead.from_pretrained(name_or_path)


@contextmanager
def naming_damaged_weights(*folders: str) -> Iterator[None]:
    """Turn safetensors' error on a damaged weights file into a ValueError naming the file."""
    try:
        yield
    except SafetensorError as error:
        damaged = [path for folder in folders if os.path.isdir(folder)
                   for path in sorted(glob(os.path.join(folder, "*.safetensors"))) if not _readable(path)]
        raise ValueError(f"damaged weights file {', '.join(damaged or folders)} ({error}): save or download it "
                         "again") from None


def _readable(path: str) -> bool:
    try:
        with safe_open(path, "pt"):
            return True
    except (SafetensorError, OSError):
        return False


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of `load_model(name_or_path)`: an adapter folder's own, else its base's."""
    source = name_or_path
    if is_peft_adapter(name_or_path) and not os.path.isfile(os.path.join(name_or_path, "tokenizer_config.json")):
        source = peft_base(name_or_path)
    return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, name: str = "model") -> None:
    """ValueError when the tokenizer can produce ids the model has no embedding row for."""
    if len(tokenizer) > vocab_size(model):
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but {name} has a vocabulary of {vocab_size(model)}: "
                         f"they do not belong together (pass the tokenizer of {name})")


def model_device(model: PreTrainedModel) -> torch.device:
    """Where the model's inputs go (its embedding layer's device, also under a device_map)."""
    return model.get_input_embeddings().weight.device


def last_hidden_states(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The last-layer hidden states `[batch, seq, hidden]` the head reads, for right- or left-padded input."""
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions_from_mask(attention_mask),
                 output_hidden_states=True, logits_to_keep=1, use_cache=False).hidden_states[-1]


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids `[batch, seq]` counting each row's real tokens only."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
