"""Loading models as users have them (folders, PEFT adapters, dtypes) and vocabulary checks."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama, tiny_tokenizer

from specdecpp.checks import check_same_vocab, vocab_size
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.models import (check_tokenizer, last_hidden_states, load_head, load_model, load_tokenizer, parse_dtype,
                              positions_from_mask)


def test_folder_loads_with_dtype_in_eval_mode(pair_dirs):
    model = load_model(pair_dirs[0], torch_dtype="float32")
    assert model.dtype == torch.float32 and not model.training
    assert load_model(pair_dirs[0], torch_dtype="bfloat16").dtype == torch.bfloat16
    assert parse_dtype("auto") == "auto" and parse_dtype(None) is None
    assert load_model(pair_dirs[0]).dtype == torch.float64  # the checkpoint's own when it is not half precision


def test_half_precision_checkpoint_runs_in_float32_on_a_cpu_unless_asked(tmp_path):
    from conftest import tiny_llama

    tiny_llama(dtype=torch.float16).save_pretrained(tmp_path)
    assert load_model(str(tmp_path)).dtype == torch.float32
    assert load_model(str(tmp_path), torch_dtype="float16").dtype == torch.float16
    with pytest.raises(ValueError, match="torch_dtype"):
        parse_dtype("float8")


def test_peft_adapter_folder_loads_merged_onto_its_base(pair_dirs, tmp_path):
    from peft import LoraConfig, get_peft_model

    base = load_model(pair_dirs[0])
    peft_model = get_peft_model(load_model(pair_dirs[0]), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                    init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    assert peft_model.peft_config["default"].base_model_name_or_path == pair_dirs[0]
    ids = torch.tensor([[1, 5, 9, 30, 41]])
    with torch.no_grad():
        expected = peft_model(ids).logits
        loaded = load_model(str(tmp_path / "adapter"))
        assert not hasattr(loaded, "peft_config"), "the adapter is merged: a plain model comes back"
        torch.testing.assert_close(loaded(ids).logits, expected)
        assert not torch.allclose(base(ids).logits, expected), "the adapter changes the model"
    assert len(load_tokenizer(str(tmp_path / "adapter"))) == 64  # from the base folder


def test_trust_remote_code_is_off_by_default(pair_dirs, monkeypatch):
    seen = {}
    import transformers

    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr("specdecpp.models.AutoModelForCausalLM.from_pretrained", spy)
    load_model(pair_dirs[0], device_map="cpu")
    assert seen["trust_remote_code"] is False and seen["device_map"] == "cpu"


def test_tokenizer_and_model_vocabularies_must_fit():
    tokenizer = tiny_tokenizer()
    check_tokenizer(tokenizer, tiny_llama(vocab_size=64))
    check_tokenizer(tokenizer, tiny_llama(vocab_size=128))  # padded embeddings are fine
    with pytest.raises(ValueError, match="tokenizer has 64 tokens"):
        check_tokenizer(tokenizer, tiny_llama(vocab_size=48))
    check_same_vocab(vocab_size(tiny_llama(seed=0)), vocab_size(tiny_llama(seed=1)))
    with pytest.raises(ValueError, match="vocabulary"):
        check_same_vocab(vocab_size(tiny_llama(vocab_size=64)), vocab_size(tiny_llama(vocab_size=80)))


def test_last_hidden_states_ignore_padding(tiny_pair):
    model = tiny_pair[0]
    ids = torch.tensor([[1, 5, 9, 30]])
    with torch.no_grad():
        alone = last_hidden_states(model, ids, torch.ones_like(ids))
        left = last_hidden_states(model, torch.tensor([[0, 0, 1, 5, 9, 30]]), torch.tensor([[0, 0, 1, 1, 1, 1]]))
        right = last_hidden_states(model, torch.tensor([[1, 5, 9, 30, 0]]), torch.tensor([[1, 1, 1, 1, 0]]))
        final = model(ids, output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(left[:, 2:], alone)
    torch.testing.assert_close(right[:, :4], alone)
    torch.testing.assert_close(alone, final)


def test_positions_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]
    assert positions_from_mask(mask.bool()).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]


def cut_short(path) -> None:
    """Truncate a file to half its length, as an interrupted copy or download leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_damaged_weights_file_is_named(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "model")
    AcceptancePredictionHead(32, 1).save_pretrained(tmp_path / "head")
    for folder, load in (("model", load_model), ("head", load_head)):
        cut_short(tmp_path / folder / "model.safetensors")
        with pytest.raises(ValueError, match=f"damaged weights file {tmp_path / folder / 'model.safetensors'} "):
            load(str(tmp_path / folder))


def test_a_model_folder_is_not_taken_for_a_head(pair_dirs, tmp_path):
    with pytest.raises(ValueError, match="is not a head folder: its config.json is a llama model's"):
        load_head(pair_dirs[0])
    with pytest.raises(FileNotFoundError, match="is not a head folder \\(no config.json\\)"):
        load_head(str(tmp_path))
