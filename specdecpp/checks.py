"""Checks every command shares on explicit values. Imports nothing of the toolkit but `compat`."""
from __future__ import annotations

import json
import os

import torch
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from specdecpp.compat import SLIDING_WINDOW_ROLLS_BACK, TRANSFORMERS_VERSION, has_recurrent_state, has_sliding_window


def vocab_size(model: PreTrainedModel) -> int:
    """Rows of the model's output layer: the size of the distributions it produces."""
    output = model.get_output_embeddings()
    return output.weight.shape[0] if output is not None else model.config.vocab_size


def check_data_fits_draft(records: list[dict], draft: PreTrainedModel) -> None:
    """ValueError when records hold token ids the draft has no embedding for."""
    top_id = max(max(r["prefix"] + r["tokens"] + r["draft"]) for r in records)
    if top_id >= vocab_size(draft):
        raise ValueError(f"the data holds token id {top_id} but the draft's vocabulary has {vocab_size(draft)} "
                         "tokens: the data was built with another tokenizer")


def check_same_vocab(target_vocab: int, draft_vocab: int) -> None:
    """ValueError unless target and draft score vocabularies of the same size."""
    if target_vocab != draft_vocab:
        raise ValueError(f"target vocabulary ({target_vocab}) and draft vocabulary ({draft_vocab}) differ: "
                         "the draft must share the target's tokenizer")


def check_can_roll_back(model: PreTrainedModel, role: str = "model") -> None:
    """ValueError for a model whose cache cannot be cut back (recurrent or old sliding layers); `role` names it."""
    if has_recurrent_state(model):
        raise ValueError(f"{role} ({type(model).__name__}) has recurrent layers (state-space or linear attention) whose "
                         "state cannot be rolled back after a rejected draft token: speculative decoding needs models "
                         "whose cache can be cropped (attention-only architectures)")
    if not SLIDING_WINDOW_ROLLS_BACK and has_sliding_window(model):
        raise ValueError(f"{role} ({type(model).__name__}) has sliding-window attention, whose cache transformers "
                         f"{TRANSFORMERS_VERSION} cannot roll back after a rejected draft token: install transformers "
                         ">= 5.18 to decode it")


def hidden_size(config: PretrainedConfig) -> int:
    """The hidden size of a model config (its text part for a multimodal one): what a head reads."""
    return config.get_text_config().hidden_size


def check_head_fits_draft(head_hidden: int, draft_hidden: int, head: str = "the head", hint: str = "") -> None:
    """ValueError when a head reading states of size `head_hidden` meets a draft of `draft_hidden`."""
    if head_hidden and head_hidden != draft_hidden:  # 0: a head of logit features alone fits any draft
        raise ValueError(f"{head} reads hidden states of size {head_hidden}, but the draft's hidden size is "
                         f"{draft_hidden}: it was trained for another draft{hint}")


def read_head_config(folder: str) -> dict:
    """The config of the head saved in the local `folder`, or an error saying why it is not a head."""
    config_file = os.path.join(folder, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{folder} is not a head folder (no config.json)")
    try:
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as error:  # a JSON or a text decoding error
        raise ValueError(f"{config_file} is damaged ({error}): save the head again or restore the file") from None
    config = config if isinstance(config, dict) else {}
    if "model_type" in config or "architectures" in config or not isinstance(config.get("hidden_size"), int):
        what = f"a {config['model_type']} model's" if "model_type" in config else "not a head's"
        raise ValueError(f"{folder} is not a head folder: its config.json is {what} (a head's holds hidden_size, "
                         "num_layers, alignment); pass a folder train.py wrote, its --output_dir or a checkpoint-*")
    if not any(os.path.isfile(os.path.join(folder, name)) for name in ("model.safetensors", "pytorch_model.bin")):
        raise ValueError(f"{folder} is not a head folder: it holds a head's config.json but no weights "
                         "(model.safetensors)")
    return config


def is_peft_adapter(name_or_path: str) -> bool:
    """True for a local folder that holds a PEFT adapter rather than a full model."""
    return os.path.isfile(os.path.join(name_or_path, "adapter_config.json"))


def peft_base(name_or_path: str) -> str:
    """The base model the PEFT adapter folder `name_or_path` names, or ValueError."""
    from peft import PeftConfig

    base = PeftConfig.from_pretrained(name_or_path).base_model_name_or_path
    if not base:
        raise ValueError(f"PEFT adapter {name_or_path} does not name its base model (base_model_name_or_path)")
    return base


def text_config(name_or_path: str, trust_remote_code: bool = False) -> PretrainedConfig:
    """The (text) config of a model, or of a PEFT adapter's base, without loading weights."""
    source = peft_base(name_or_path) if is_peft_adapter(name_or_path) else name_or_path
    return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code).get_text_config()


def eos_ids(*values: int | list[int] | tuple[int, ...] | torch.Tensor | None) -> set[int]:
    """Every token id among `values` (ids, lists, tensors or None)."""
    ids: set[int] = set()
    for value in values:
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        ids |= {int(value)} if isinstance(value, int) else {int(t) for t in value}
    return ids


def generation_eos(model: PreTrainedModel) -> int | list[int] | None:
    """The EOS id(s) of the model's generation config (None when it has none)."""
    return getattr(getattr(model, "generation_config", None), "eos_token_id", None)


def trim_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """`tokens` up to and including the first id in `eos`."""
    return next((tokens[: i + 1] for i, token in enumerate(tokens) if token in eos), tokens)
