"""The zoo builder: a micro pair built end to end in a temporary folder, and its parts."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from specdecpp.data import stdlib_corpus
from specdecpp.training import zoo

MICRO = dict(max_train_files=8, vocab_size=400, seq_len=64, width=64, target_layers=2, draft_layers=1,
             batch_size=4, target_steps=4, draft_steps=2, warmup_steps=2, eval_functions=3, eval_prompts=3,
             continuation_tokens=6, cost_reps=3, bf16=False, draft_hard_label_weight=0.5)


@pytest.fixture(scope="module")
def micro_build(tmp_path_factory):
    """(output folder, card) of a micro build: a few files, a few steps, a few prompts."""
    out = tmp_path_factory.mktemp("zoo")
    card = zoo.build(zoo.ZooArguments(output=str(out), **MICRO))
    return out, card


@pytest.mark.slow  # the zoo build
def test_saved_folders_load_as_float32_with_the_shared_tokenizer(micro_build):
    out, _ = micro_build
    target = AutoModelForCausalLM.from_pretrained(out / "target")  # dtype "auto" reads float32
    draft = AutoModelForCausalLM.from_pretrained(out / "draft", dtype=torch.float32)
    assert target.dtype == draft.dtype == torch.float32
    assert target.config.num_hidden_layers == 2 and draft.config.num_hidden_layers == 1
    assert target.config.vocab_size == draft.config.vocab_size == 400
    assert (out / "target" / "tokenizer.json").read_bytes() == (out / "draft" / "tokenizer.json").read_bytes()
    with safe_open(out / "target" / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}


@pytest.mark.slow  # the zoo build
def test_tokenizer_round_trips_and_starts_documents_with_eos(micro_build):
    out, _ = micro_build
    tok = AutoTokenizer.from_pretrained(out / "draft")
    text = 'def f(x):\n    """Return x, ünïcode ∑ and\ttabs."""\n        return x  # 🙂\n'
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.eos_token_id == tok.bos_token_id == tok.pad_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert max(ids) < 400


@pytest.mark.slow  # the zoo build
def test_card_records_the_figures(micro_build):
    out, card = micro_build
    on_disk = json.loads((out / "card.json").read_text())
    assert on_disk["figures"].keys() == {"stdlib-heldout", "humaneval", "cost"}
    for name in ("stdlib-heldout", "humaneval"):
        fig = on_disk["figures"][name]
        assert math.isfinite(fig["target_loss"]) and math.isfinite(fig["draft_loss"])
        assert 0.0 <= fig["agreement"] <= 1.0 and fig["tokens"] > 0
    assert on_disk["figures"]["cost"]["c"] > 0
    assert on_disk["training"]["target"]["steps"] == 4 and on_disk["corpus"]["train_files"] == 8
    assert on_disk["bytes"] == card["bytes"] > 0
    assert on_disk["command"].startswith("specdecpp zoo build ") and "--vocab_size 400" in on_disk["command"]
    assert on_disk["targets"].keys() == {"gap", "agreement", "c"}
    assert "--draft_hard_label_weight 0.5" in on_disk["command"]
    readme = (out / "README.md").read_text()
    assert "| humaneval |" in readme and "KL on target logits + 0.5 x cross-entropy on its argmax" in readme


def test_targets_use_the_worst_set():
    sets = {"stdlib-heldout": {"gap": 0.5, "agreement": 0.9}, "humaneval": {"gap": 0.2, "agreement": 0.75}}
    checks = zoo.check_targets({**sets, "cost": {"c": 0.3}})
    assert checks["gap"] == {"required": 0.3, "measured": 0.2, "met": False}
    assert checks["agreement"]["measured"] == 0.75 and checks["agreement"]["met"]
    assert not checks["c"]["met"]


@pytest.mark.slow  # the zoo build
def test_agreement_of_a_model_with_itself_is_one(micro_build):
    out, _ = micro_build
    target = zoo.load_zoo_model(out / "target")
    tok = AutoTokenizer.from_pretrained(out / "target")
    prompts = stdlib_corpus.heldout_function_prompts(limit=2)
    result = zoo.greedy_agreement(target, target, tok, prompts, zoo.ZooArguments(**MICRO))
    assert result["agreement"] == 1.0 and result["tokens"] > 0


def test_draft_copies_embeddings_first_layer_and_norm_of_the_target():
    torch.manual_seed(0)
    tok = zoo.train_tokenizer(["def f(x):\n    return x\n"] * 10, vocab_size=300)
    args = zoo.ZooArguments(width=64)
    target = LlamaForCausalLM(zoo.llama_config(args, 3, tok))
    draft = zoo.draft_from_target(target, zoo.llama_config(args, 1, tok))
    t, d = target.state_dict(), draft.state_dict()
    assert len(draft.model.layers) == 1
    for key in d:
        assert torch.equal(d[key], t[key]), key
    assert draft.lm_head.weight.data_ptr() == draft.model.embed_tokens.weight.data_ptr()  # still tied


def test_training_is_deterministic_given_the_seed():
    tok = zoo.train_tokenizer(["def f(x):\n    return x\n"] * 10, vocab_size=300)
    args = zoo.ZooArguments(width=64, seq_len=16, batch_size=2, warmup_steps=1, bf16=False)
    stream = torch.randint(0, len(tok), (500,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    states = []
    for _ in range(2):
        torch.manual_seed(0)
        model = LlamaForCausalLM(zoo.llama_config(args, 1, tok))
        log = zoo.train_lm(model, zoo.lm_loss, stream, args, steps=3, minutes=10, lr=1e-3, desc="t", seed=7)
        states.append(model.state_dict())
    assert log["steps"] == 3 and log["tokens"] == 3 * 2 * 16
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_schedule_warms_up_then_decays_to_a_tenth():
    assert zoo.lr_at(0, 0.0, 1.0, warmup=10) == pytest.approx(0.1)
    assert zoo.lr_at(50, 0.0, 1.0, warmup=10) == pytest.approx(1.0)
    assert zoo.lr_at(50, 0.5, 1.0, warmup=10) == pytest.approx(0.55)
    assert zoo.lr_at(99, 1.0, 1.0, warmup=10) == pytest.approx(0.1)


def test_main_requires_the_build_command():
    with pytest.raises(SystemExit):
        zoo.main([])


def test_the_committed_pair_and_head_fit_together_and_decode_losslessly():
    """checkpoints/zoo as committed: within its 40 MB, the card's sizes and target verdicts agree
    with the files, the head fits the draft, and ada on the real pair gives the target's output."""
    from specdecpp import AcceptancePredictionHead, speculative_generate

    root = zoo.Path(__file__).resolve().parent.parent / "checkpoints" / "zoo"
    assert zoo.dir_bytes(root) <= 40 * 2**20
    card = json.loads((root / "card.json").read_text())
    target, draft = zoo.load_zoo_model(root / "target"), zoo.load_zoo_model(root / "draft")
    assert target.config.vocab_size == draft.config.vocab_size == card["models"]["vocab_size"]
    assert zoo.count_params(target) == card["models"]["target"]["params"]
    assert zoo.count_params(draft) == card["models"]["draft"]["params"]
    assert zoo.check_targets(card["figures"]) == card["targets"]
    head = AcceptancePredictionHead.from_pretrained(root / "head")
    assert head.hidden_size == draft.config.hidden_size

    tokenizer = AutoTokenizer.from_pretrained(root / "target")
    ids = torch.tensor([tokenizer(stdlib_corpus.heldout_functions()[0].prompt)["input_ids"]])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                               pad_token_id=tokenizer.eos_token_id)
    out = speculative_generate(target, draft, ids, schedule="ada", head=head, stop_threshold=0.7, max_new_tokens=24)
    assert out.sequences.tolist() == expected.tolist()


def test_hard_labels_add_cross_entropy_on_the_targets_argmax():
    torch.manual_seed(0)
    tok = zoo.train_tokenizer(["def f(x):\n    return x\n"] * 10, vocab_size=300)
    args = zoo.ZooArguments(width=64)
    target = LlamaForCausalLM(zoo.llama_config(args, 2, tok)).eval()
    draft = LlamaForCausalLM(zoo.llama_config(args, 1, tok))
    x = torch.randint(0, len(tok), (2, 8))
    kl = zoo.distill_loss(target)(draft, x)
    labels = target(input_ids=x).logits.argmax(-1)
    ce = torch.nn.functional.cross_entropy(draft(input_ids=x).logits.flatten(0, 1), labels.flatten())
    assert zoo.distill_loss(target, 0.5)(draft, x).item() == pytest.approx(kl.item() + 0.5 * ce.item(), rel=1e-5)
    assert zoo.distill_loss(target)(target, x).item() == pytest.approx(0.0, abs=1e-5)
