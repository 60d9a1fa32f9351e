"""Prompt sources (registered sets, local files, Hub names) and prompt formatting."""
from __future__ import annotations

import json

import pytest
from conftest import tiny_tokenizer

from specdecpp.data import prompts
from specdecpp.data.prompts import format_prompt, load_prompts, prompt_text, register_prompt_set, tokenize_prompt


def test_humaneval_comes_from_the_package_offline():
    texts = load_prompts("humaneval")
    assert len(texts) == 164 and texts[0].startswith("from typing import List")
    assert load_prompts("humaneval", n_begin=10, n_end=12) == texts[10:12]


def test_stdlib_heldout_is_registered_without_importing_evaluation():
    texts = load_prompts("stdlib-heldout", n_end=3)
    assert len(texts) == 3 and all(t.lstrip().startswith("def ") for t in texts)


def test_row_fields_of_each_dataset():
    assert prompt_text({"prompt": "def f():", "task_id": "HumanEval/0"}) == "def f():"
    assert prompt_text({"instruction": "Add.", "input": "1 and 2", "output": "3"}) == "Add.\n\n1 and 2"
    assert prompt_text({"instruction": "Say hi.", "input": ""}) == "Say hi."
    assert prompt_text({"question": "2+2?", "answer": "4"}) == "2+2?"
    with pytest.raises(ValueError, match="no prompt field"):
        prompt_text({"text": "x"}, "rows.jsonl: row 0")


def test_local_json_and_jsonl_files(tmp_path):
    (tmp_path / "alpaca.json").write_text(json.dumps([{"instruction": "A", "input": ""}, {"instruction": "B", "input": "c"}]))
    (tmp_path / "gsm8k.jsonl").write_text("\n".join(json.dumps({"question": q}) for q in "xyz") + "\n")
    assert load_prompts(str(tmp_path / "alpaca.json")) == ["A", "B\n\nc"]
    assert load_prompts(str(tmp_path / "gsm8k.jsonl"), n_begin=1) == ["y", "z"]
    with pytest.raises(FileNotFoundError):
        load_prompts(str(tmp_path / "absent.jsonl"))
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(str(tmp_path / "gsm8k.jsonl"), n_begin=5)
    with pytest.raises(ValueError, match="n_begin"):
        load_prompts(str(tmp_path / "gsm8k.jsonl"), n_begin=2, n_end=1)


def test_a_malformed_line_is_named_with_its_file_and_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    # line 3 is blank and line 2 holds a U+2028 inside a string: neither may shift the count
    path.write_text('{"prompt": "a"}\n{"prompt": "b\u2028c"}\n\n{"prompt": "d"}\n{"prompt": "e\n', encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{path}: line 5 is not valid JSON"):
        load_prompts(str(path))
    path.write_text('[{"prompt": "a"},\n {"prompt": }]')
    with pytest.raises(ValueError, match=rf"^{path}: not valid JSON \(.*line 2 column"):
        load_prompts(str(path))


def test_hub_names_go_through_datasets_with_the_reference_defaults(monkeypatch):
    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return [{"question": "q1"}, {"question": "q2"}]

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    assert load_prompts("gsm8k") == ["q1", "q2"]
    load_prompts("openai_humaneval")
    load_prompts("tatsu-lab/alpaca", split="train[:10]")
    assert calls == [("gsm8k", "main", "train"), ("openai_humaneval", None, "test"), ("tatsu-lab/alpaca", None, "train[:10]")]


def test_registry_adds_named_sets(monkeypatch):
    monkeypatch.setitem(prompts.PROMPT_SETS, "mine", None)
    register_prompt_set("mine", lambda: ["one", "two", "three"])
    assert load_prompts("mine", n_end=2) == ["one", "two"]


def test_formats():
    tokenizer = tiny_tokenizer()
    assert format_prompt("the a", tokenizer, "raw") == "the a"
    assert format_prompt(" the a ", tokenizer, "llama2") == "[INST] the a [/INST]"
    assert format_prompt("the a", tokenizer, "auto") == "the a"  # no chat template: raw
    with pytest.raises(ValueError, match="chat template"):
        format_prompt("the a", tokenizer, "chat")
    with pytest.raises(ValueError, match="unknown prompt format"):
        format_prompt("the a", tokenizer, "alpaca")
    tokenizer.chat_template = "{% for m in messages %}<s> {{ m['content'] }} </s>{% endfor %}{% if add_generation_prompt %} of{% endif %}"
    assert format_prompt("the a", tokenizer, "auto") == "<s> the a </s> of"
    text, ids = tokenize_prompt("the a", tokenizer, "chat")
    assert ids == [1, 4, 5, 2, 6], "the template's own BOS, not a second one"
    assert tokenize_prompt("the a", tokenizer, "raw")[1] == [1, 4, 5]


@pytest.mark.slow  # parses the standard library's train split
def test_stdlib_train_is_registered_and_differs_from_heldout():
    train = load_prompts("stdlib-train", n_end=20)
    assert len(train) == 20 and all(t.lstrip().startswith(("def ", "async def ")) for t in train)
    assert not set(train) & set(load_prompts("stdlib-heldout", n_end=20))
