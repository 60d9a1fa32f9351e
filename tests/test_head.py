"""The acceptance prediction head: shape, saving/loading, the reference's checkpoint layout, its card."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_model
from torch import nn

from specdecpp import AcceptancePredictionHead
from specdecpp.head.model import FEATURES, LeanJudge, ResBlock, logit_features


class ReferenceHead(nn.Module):
    """The reference implementation's head: `[ResBlock(h)] * k` repeats ONE block k times."""

    def __init__(self, hidden_size: int, num_layers: int):
        super().__init__()
        self.model = nn.Sequential(*([ResBlock(hidden_size)] * num_layers), nn.Linear(hidden_size, 2))

    def forward(self, x):
        return self.model(x)


def randomized(module: nn.Module, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    return module


def test_blocks_are_distinct_and_forward_gives_two_logits():
    head = AcceptancePredictionHead(16, 3)
    assert len({id(b.linear.weight) for b in head.model[:-1]}) == 3
    x = torch.randn(2, 5, 16)
    assert head(x).shape == (2, 5, 2)
    probs = head.accept_prob(x.double())
    assert probs.dtype == torch.float32 and ((0 < probs) & (probs < 1)).all()
    torch.testing.assert_close(probs, head(x).softmax(-1)[..., 1])
    with pytest.raises(ValueError):
        AcceptancePredictionHead(0, 3)


def test_save_and_load_round_trip(tmp_path):
    head = randomized(AcceptancePredictionHead(16, 3))
    head.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == {"hidden_size": 16, "num_layers": 3,
                                                                   "alignment": "reader"}
    loaded = AcceptancePredictionHead.from_pretrained(tmp_path)
    x = torch.randn(4, 16)
    torch.testing.assert_close(loaded(x), head(x))
    assert not loaded.training


def test_a_head_of_narrower_blocks_projects_its_inputs_and_round_trips(tmp_path):
    head = randomized(AcceptancePredictionHead(16, 2, alignment="proposer", features=["log_q"], width=4))
    assert head.input_projection()[0].shape == (4, 17) and head.model[0].linear.weight.shape == (4, 4)
    head.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["width"] == 4
    loaded = AcceptancePredictionHead.from_pretrained(tmp_path)
    x, f = torch.randn(3, 16), torch.randn(3, 1)
    torch.testing.assert_close(loaded(x, f), head(x, f))
    with pytest.raises(ValueError, match="width"):
        AcceptancePredictionHead(16, 2, width=0)


@pytest.mark.parametrize("file_format", ["safetensors", "pickle"])
def test_reference_checkpoint_loads_with_identical_outputs(tmp_path, file_format):
    reference = randomized(ReferenceHead(16, 3))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 16, "num_layers": 3}))
    if file_format == "safetensors":
        save_model(reference, str(tmp_path / "model.safetensors"))  # drops the shared copies
        assert not any(k.startswith("model.1.") for k in load_file(tmp_path / "model.safetensors"))
    else:
        torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    head = AcceptancePredictionHead.from_pretrained(tmp_path)
    x = torch.randn(3, 7, 16)
    assert torch.equal(head(x), reference(x))
    assert torch.equal(head.accept_prob(x), reference(x).softmax(-1)[..., 1])


def test_checkpoint_of_another_shape_is_refused(tmp_path):
    AcceptancePredictionHead(16, 3).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "num_layers": 3}))
    with pytest.raises(RuntimeError, match="size mismatch"):
        AcceptancePredictionHead.from_pretrained(tmp_path)


def test_model_card_records_pair_data_and_metrics(tmp_path):
    AcceptancePredictionHead(8, 1).save_pretrained(tmp_path, model_card_kwargs={
        "draft": "org/draft-135M", "target": "org/target-1.7B", "training_data": "data/alpaca.jsonl",
        "eval_metrics": {"eval_binary_kl": 0.123}})
    card = (tmp_path / "README.md").read_text()
    for text in ("org/draft-135M", "org/target-1.7B", "data/alpaca.jsonl", "| eval_binary_kl | 0.123 |",
                 "library_name: specdecpp", "2405.19715"):
        assert text in card
    assert "do_sample" not in card
    assert json.loads((tmp_path / "card.json").read_text())["target"] == "org/target-1.7B"  # re-renders from the folder


def test_model_card_examples_follow_the_stored_threshold(tmp_path):
    head = AcceptancePredictionHead(8, 1, alignment="proposer", stop_threshold=0.25,
                                    threshold_selection={"bound": [1, 20], "mode": "sampling"})
    head.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert 'stop_threshold="auto", bound=(1, 20), do_sample=True)' in card


def test_reference_constructor_call_and_config():
    head = AcceptancePredictionHead({"hidden_size": 16, "num_layers": 2})
    assert (head.hidden_size, head.num_layers, head.alignment, head.features) == (16, 2, "reader", [])
    assert head.config == {"hidden_size": 16, "num_layers": 2, "alignment": "reader"}
    proposer = AcceptancePredictionHead({"hidden_size": 16, "num_layers": 2, "alignment": "proposer",
                                         "features": ["log_q", "entropy"]})
    assert proposer.alignment == "proposer" and proposer.model[0].linear.weight.shape == (18, 18)
    with pytest.raises(ValueError, match="alignment"):
        AcceptancePredictionHead(16, alignment="writer")
    with pytest.raises(ValueError, match="unknown head features"):
        AcceptancePredictionHead(16, alignment="proposer", features=["target_logit"])
    with pytest.raises(ValueError, match="proposer"):
        AcceptancePredictionHead(16, alignment="reader", features=["log_q"])


def test_proposer_head_with_features_round_trips_with_its_threshold(tmp_path):
    head = randomized(AcceptancePredictionHead(16, 2, alignment="proposer", features=["log_q", "entropy"]))
    head.with_threshold(0.45, {"cost_per_token": [0.5, 0.6]}).save_pretrained(tmp_path)
    loaded = AcceptancePredictionHead.from_pretrained(tmp_path)
    assert loaded.config == head.config and loaded.resolve_stop_threshold("auto") == 0.45
    x, f = torch.randn(4, 16), torch.randn(4, 2)
    torch.testing.assert_close(loaded(x, f), head(x, f))
    with pytest.raises(ValueError, match="features"):
        loaded(x)


def test_auto_threshold_without_a_stored_one_is_a_clear_error():
    head = AcceptancePredictionHead(16, 2, alignment="proposer")
    assert head.resolve_stop_threshold(0.3) == 0.3
    with pytest.raises(ValueError, match="no stored threshold|has none"):
        head.resolve_stop_threshold("auto")


def test_logit_features_are_log_q_and_entropy():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    tokens = torch.tensor([2, 1])
    features = logit_features(logits, tokens, ["log_q", "entropy"])
    log_probs = logits.log_softmax(-1)
    torch.testing.assert_close(features[:, 0], log_probs[[0, 1], [2, 1]])
    torch.testing.assert_close(features[:, 1], -(log_probs.exp() * log_probs).sum(-1))
    ruled_out = logit_features(torch.tensor([0.0, float("-inf")]), torch.tensor(1), ["log_q", "entropy"])
    assert torch.isfinite(ruled_out).all()


def test_features_from_the_shared_softmax_equal_logit_features():
    """The features of one drafted token from the softmax its draft step computed equal those of the
    raw logits alone: for the argmax (greedy), sampled and unlikely tokens, and logits the draft rules out."""
    torch.manual_seed(0)
    logits = torch.randn(64) * 4
    logits[7] = -30.0  # probability ~1e-14: log Z is read at the argmax instead
    names = list(FEATURES)
    probs = logits.softmax(-1)
    for token in (int(logits.argmax()), int(torch.multinomial(probs, 1)), 7):
        torch.testing.assert_close(logit_features(logits, torch.tensor(token), names, probs),
                                   logit_features(logits, torch.tensor(token), names), rtol=1e-5, atol=1e-5)
    ruled_out = torch.tensor([2.0, float("-inf"), 0.5])
    torch.testing.assert_close(logit_features(ruled_out, torch.tensor(0), names, ruled_out.softmax(-1)),
                               logit_features(ruled_out, torch.tensor(0), names), rtol=1e-5, atol=1e-5)


def test_lean_judge_reads_the_features_of_the_drafted_token():
    head = AcceptancePredictionHead(2, num_layers=0, alignment="proposer", features=["log_q"])
    with torch.no_grad():  # P(accept) = sigmoid(10 + 10 log q): near 1 for a sure token, below 1/2 for a doubtful one
        head.model[-1].weight.copy_(torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 10.0]]))
        head.model[-1].bias.copy_(torch.tensor([0.0, 10.0]))
    judge, hidden, token = LeanJudge(head), torch.zeros(2), torch.tensor(0)
    assert judge(hidden, torch.tensor([10.0, -10.0, -10.0]), token) > 0.99
    assert judge(hidden, torch.tensor([0.0, 0.0, 0.0]), token) < 0.5


def test_margin_is_the_token_log_q_minus_the_best_other_token():
    logits = torch.tensor([[0.0, 1.0, 3.0], [0.0, 1.0, 3.0], [5.0, 5.0, 0.0]])
    log_probs = logits.log_softmax(-1)
    margin = logit_features(logits, torch.tensor([2, 1, 0]), ["margin"])[:, 0]
    # the argmax against the runner-up, a sampled runner-up against the argmax (negative), a tie
    torch.testing.assert_close(margin, torch.stack([log_probs[0, 2] - log_probs[0, 1],
                                                    log_probs[1, 1] - log_probs[1, 2], torch.tensor(0.0)]))


def test_log_rank_counts_the_tokens_the_draft_rates_higher():
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]])
    ranks = logit_features(logits.expand(4, 4), torch.tensor([2, 3, 1, 0]), ["log_rank"])[:, 0]
    torch.testing.assert_close(ranks, torch.log1p(torch.tensor([0.0, 1.0, 2.0, 3.0])))


def test_a_head_of_logit_features_alone_reads_no_hidden_state(tmp_path):
    head = randomized(AcceptancePredictionHead(0, 2, alignment="proposer", features=["log_q", "margin"]))
    features = torch.randn(4, 2)
    assert not head.reads_hidden_states
    torch.testing.assert_close(head.accept_prob(None, features), head.accept_prob(torch.randn(4, 99), features))
    head.save_pretrained(tmp_path)
    loaded = AcceptancePredictionHead.from_pretrained(tmp_path)
    assert loaded.config["hidden_size"] == 0
    torch.testing.assert_close(loaded.accept_prob(None, features), head.accept_prob(None, features))
    with pytest.raises(ValueError, match="needs logit features"):
        AcceptancePredictionHead(0, 2, alignment="proposer")


@pytest.mark.parametrize("config", [dict(alignment="reader"),
                                    dict(alignment="proposer", features=["log_q", "entropy"]),
                                    dict(alignment="proposer", features=["log_q", "entropy", "margin"]),
                                    dict(hidden_size=0, alignment="proposer", features=["log_q", "entropy", "margin"]),
                                    dict(alignment="proposer", features=["log_q", "entropy", "margin"], width=8),
                                    dict(alignment="proposer")])
def test_lean_judge_equals_accept_prob(config):
    config = {"hidden_size": 16, **config}
    head = randomized(AcceptancePredictionHead(num_layers=3, **config), seed=3)
    judge = LeanJudge(head)
    torch.manual_seed(1)
    for _ in range(5):
        hidden, logits = torch.randn(16), torch.randn(32) * 3
        token = torch.multinomial(logits.softmax(-1), 1)[0]
        features = logit_features(logits, token, head.features) if head.features else None
        expected = head.accept_prob(hidden, features)
        torch.testing.assert_close(judge(hidden, logits, token), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(judge(hidden, logits, token, logits.softmax(-1)), expected, rtol=1e-5, atol=1e-6)
    hidden, logits = torch.randn(6, 16), torch.randn(6, 32) * 3  # a batch of rows, judged at once
    token, given = logits.argmax(-1), hidden.clone()
    features = logit_features(logits, token, head.features) if head.features else None
    torch.testing.assert_close(judge(hidden, logits, token), head.accept_prob(hidden, features), rtol=1e-5, atol=1e-6)
    assert torch.equal(hidden, given)  # its states are its own: the hidden states it read are left as they were


ZOO = Path(__file__).resolve().parent.parent / "checkpoints" / "zoo"


COMMITTED_HEADS = [("head", []), ("head-sampling", ["log_q", "entropy", "margin"]), ("head-reference", []),
                   ("head-tree", ["log_q", "margin", "log_rank"]),
                   ("head-sampling-tree", ["log_q", "margin", "log_rank", "log_left"])]


@pytest.mark.parametrize("name,features", COMMITTED_HEADS)
def test_committed_heads_of_every_generation_load_and_decode_losslessly(name, features):
    """Heads with three and no logit features (the greedy proposer head on the hidden state alone, the
    reference's reader head) load unchanged and decode exactly the target's greedy output."""
    from transformers import AutoModelForCausalLM

    from specdecpp import speculative_generate

    head = AcceptancePredictionHead.from_pretrained(ZOO / name)
    assert head.features == features and head.reads_hidden_states
    target, draft = (AutoModelForCausalLM.from_pretrained(ZOO / part, dtype=torch.float32).eval()
                     for part in ("target", "draft"))
    prompt = torch.tensor([[1, 822, 2070, 29898]]) % target.config.vocab_size
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=24)
    out = speculative_generate(target, draft, prompt, schedule="ada", head=head, stop_threshold=0.5,
                               max_new_tokens=24, bound=(1, 20))
    assert torch.equal(out.sequences, expected)


@pytest.mark.slow  # end to end, per head; the acceptance step is test_sampling.py's
@pytest.mark.parametrize("name", [name for name, _ in COMMITTED_HEADS])
@torch.no_grad()
def test_committed_heads_sample_the_targets_distribution(name):
    """With every committed head judging (rounds of 1 to 3 tokens, as the head decides), sampled
    first two tokens on the zoo pair follow the target's distribution (top-k 6, so that the exact
    joint has 36 cells), and the test has the power to reject the draft's."""
    from scipy.stats import chisquare
    from transformers import AutoModelForCausalLM

    from specdecpp import speculative_generate
    from specdecpp.engine.sampling import make_warpers, widened

    head = AcceptancePredictionHead.from_pretrained(ZOO / name)
    target, draft = (AutoModelForCausalLM.from_pretrained(ZOO / part, dtype=torch.float32).eval()
                     for part in ("target", "draft"))
    prompt, warpers = torch.tensor([[0, 314, 321, 976]]), make_warpers(top_k=6)

    def exact_joint(model) -> dict[tuple[int, int], float]:
        p1 = warpers(None, widened(model(prompt).logits[:, -1])).softmax(-1)[0]
        firsts = p1.nonzero()[:, 0]
        rows = torch.cat([prompt.repeat(len(firsts), 1), firsts[:, None]], dim=1)
        p2 = warpers(None, widened(model(rows).logits[:, -1])).softmax(-1)
        return {(int(x1), int(x2)): float(p1[x1] * p2[i, x2]) for i, x1 in enumerate(firsts) for x2 in p2[i].nonzero()[:, 0]}

    generator, counts = torch.Generator().manual_seed(0), {}
    for _ in range(1200):
        out = speculative_generate(target, draft, prompt, schedule="ada", head=head, stop_threshold=0.5, bound=(1, 3),
                                   max_new_tokens=4, do_sample=True, top_k=6, generator=generator)
        pair = tuple(out.sequences[0, 4:6].tolist())
        counts[pair] = counts.get(pair, 0) + 1

    def pvalue(joint: dict[tuple[int, int], float]) -> float:
        if any(pair not in joint for pair in counts):  # an impossible outcome was sampled
            return 0.0
        cells = sorted(joint, key=joint.get, reverse=True)
        observed = [counts.get(c, 0) for c in cells]
        expected = [joint[c] * 1200 / sum(joint.values()) for c in cells]  # sums to 1200 despite rounding
        big = sum(e >= 5 for e in expected)  # cells expected fewer than 5 times are pooled
        return chisquare(observed[:big] + [sum(observed[big:])],
                         expected[:big] + [sum(expected[big:])]).pvalue

    assert pvalue(exact_joint(target)) > 1e-3
    assert pvalue(exact_joint(draft)) < 1e-6
