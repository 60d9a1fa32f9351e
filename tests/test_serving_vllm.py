"""The vLLM proposer's work apart from vLLM (`BatchProposer`), under vLLM's contract with a custom
proposer played here greedily: the target's output, every proposal drafted from the request's own
context whatever vLLM does to the batch (reorders, preempts, drops caches), a request alone drafting
the engine's rounds, each context read once, clear errors. tests/test_serving_vllm_engine.py runs
the same proposer inside vLLM."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import perturbed_copy, tiny_llama

from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.serving.vllm import BatchProposer, ProposerConfig

HIDDEN = 32
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny pair and a proposer head (random weights: varied round lengths), saved as folders."""
    root = tmp_path_factory.mktemp("pair")
    target = tiny_llama(seed=0)
    draft = perturbed_copy(target, noise=0.01)
    target.save_pretrained(root / "target")
    draft.save_pretrained(root / "draft")
    torch.manual_seed(4)
    head = AcceptancePredictionHead(HIDDEN, num_layers=2, alignment="proposer", features=["log_q", "entropy"])
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.5)
    head.save_pretrained(root / "head")
    return {"target": target, "draft": draft, "root": root}


def make_proposer(folders, max_tokens: int = 20, **knobs) -> BatchProposer:
    section = {"draft": str(folders["root"] / "draft"), **knobs}
    return BatchProposer(ProposerConfig.from_additional_config({"specdecpp": section}), max_tokens, MAX_MODEL_LEN,
                         target_vocab=64)


def argmax_continuation(model, tokens: list[int], n: int) -> list[int]:
    """`n` greedy tokens of `model` after `tokens`, each from a full forward (no cache to get wrong)."""
    tokens = list(tokens)
    for _ in range(n):
        tokens.append(int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(tokens) - n:]


@torch.inference_mode()
def serve(proposer: BatchProposer, target, draft, prompts: list[list[int]], max_new_tokens: list[int],
          running=lambda step, i: True, seed: int = 0) -> list[list[int]]:
    """vLLM's loop with a custom proposer, greedily: the prefill samples each request's first token;
    then at every step the running requests (`running(step, i)`, in a shuffled order) get proposals
    from their token rows and the target keeps the accepted drafted tokens and its own next one,
    up to each request's `max_new_tokens`. Checks that every proposal is the draft's greedy
    continuation of the request's own tokens. Returns the generated tokens per request."""
    order = random.Random(seed)
    seqs = [p + argmax_continuation(target, p, 1) for p in prompts]
    step = 0
    while unfinished := [i for i in range(len(prompts)) if len(seqs[i]) - len(prompts[i]) < max_new_tokens[i]]:
        rows = [i for i in unfinished if running(step, i)]
        order.shuffle(rows)
        token_ids = np.zeros((len(rows), MAX_MODEL_LEN), dtype=np.int64)
        for row, i in enumerate(rows):
            token_ids[row, :len(seqs[i])] = seqs[i]
        proposals = proposer.propose([[seqs[i][-1]] for i in rows], np.array([len(seqs[i]) for i in rows]), token_ids)
        for row, i in enumerate(rows):
            drafted = proposals[row]
            assert drafted == argmax_continuation(draft, seqs[i], len(drafted)), f"request {i} at step {step}"
            verified = target(input_ids=torch.tensor([seqs[i] + drafted])).logits[0, len(seqs[i]) - 1:].argmax(-1)
            accepted = 0
            while accepted < len(drafted) and drafted[accepted] == int(verified[accepted]):
                accepted += 1
            new = drafted[:accepted] + [int(verified[accepted])]
            seqs[i] += new[:max_new_tokens[i] - (len(seqs[i]) - len(prompts[i]))]
        step += 1
    return [seq[len(prompt):] for seq, prompt in zip(seqs, prompts)]


PROMPTS = [[5, 9, 2], [7], [3, 3, 8, 1, 12, 40], [5, 9, 2], [60, 1, 22, 9]]  # the first and fourth alike


def target_greedy(target, prompt: list[int], n: int) -> list[int]:
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("schedule", ["ada", "dynamic", "heuristic", "constant"])
def test_a_request_alone_drafts_the_rounds_of_speculative_generate(folders, schedule):
    # vLLM's prefill gives the first token, so its rounds are the engine's after prompt + that token.
    head = AcceptancePredictionHead.from_pretrained(folders["root"] / "head")
    knobs = {"schedule": schedule, "bound": (1, 20), "stop_threshold": 0.5, "num_assistant_tokens": 3}
    if schedule == "ada":
        knobs["head"] = str(folders["root"] / "head")
    for prompt in PROMPTS[:3]:
        proposer = make_proposer(folders, **knobs)
        serve(proposer, folders["target"], folders["draft"], [prompt], [30])
        (request,) = proposer.caches.requests.values()
        first = prompt + argmax_continuation(folders["target"], prompt, 1)
        engine = speculative_generate(folders["target"], folders["draft"], torch.tensor([first]), head=head,
                                      max_new_tokens=60, **{k: v for k, v in knobs.items() if k != "head"})
        assert request.draft_lengths == engine.stats.draft_lengths[:len(request.draft_lengths)]
        assert len(set(request.draft_lengths)) > 1 or schedule == "constant"


def test_requests_drafted_together_draft_the_rounds_they_draft_alone(folders):
    # Steps after a round's first run batched over the requests still drafting (draft_step.draft_steps):
    # the same proposals and, from the same states, the same judgements and round lengths.
    knobs = {"head": str(folders["root"] / "head"), "stop_threshold": 0.5, "bound": (1, 20)}
    together = make_proposer(folders, **knobs)
    serve(together, folders["target"], folders["draft"], PROMPTS, [30] * len(PROMPTS))
    lengths = [r.draft_lengths for r in together.caches.requests.values()]
    alone = []
    for prompt in PROMPTS:
        proposer = make_proposer(folders, **knobs)
        serve(proposer, folders["target"], folders["draft"], [prompt], [30])
        alone += [r.draft_lengths for r in proposer.caches.requests.values()]
    assert sorted(lengths) == sorted(alone)
    assert together.stats.draft_calls == sum(map(sum, alone))


@pytest.mark.parametrize("capacity", [256, 2])
def test_reordered_preempted_and_dropped_requests_draft_from_their_own_context(folders, capacity):
    # Request 2 leaves the batch for steps 3-6 (preempted) and comes back; rows are shuffled every
    # step; with capacity 2 most caches are dropped and read again. Outputs are the target's, and
    # `serve` checks every proposal against the draft's own greedy continuation.
    proposer = make_proposer(folders, head=str(folders["root"] / "head"), stop_threshold=0.5, bound=(1, 20),
                             max_cached_requests=capacity)
    lengths = [25, 9, 30, 25, 14]  # requests finish at different steps
    out = serve(proposer, folders["target"], folders["draft"], PROMPTS, lengths,
                running=lambda step, i: not (i == 2 and 3 <= step <= 6))
    for prompt, n, generated in zip(PROMPTS, lengths, out):
        assert generated == target_greedy(folders["target"], prompt, n)
    assert len(proposer.caches.requests) <= capacity


def test_each_context_is_read_once(folders):
    # With its cache found every step, the draft reads each verified token once, plus what it drafts.
    proposer = make_proposer(folders, head=str(folders["root"] / "head"), stop_threshold=0.5, bound=(1, 20))
    fed = []
    hook = proposer.draft.register_forward_pre_hook(lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]),
                                                    with_kwargs=True)
    try:
        out = serve(proposer, folders["target"], folders["draft"], PROMPTS, [20] * len(PROMPTS),
                    running=lambda step, i: True, seed=1)
    finally:
        hook.remove()
    contexts = sum(len(p) + len(o) for p, o in zip(PROMPTS, out))
    assert sum(fed) <= contexts + proposer.proposed_tokens
    assert len(proposer.caches.requests) == len(PROMPTS)  # the two alike prompts kept apart


def test_no_proposal_without_a_sampled_token_or_room(folders):
    proposer = make_proposer(folders, schedule="constant", num_assistant_tokens=4)
    rows = np.zeros((2, MAX_MODEL_LEN), dtype=np.int64)
    rows[1, :MAX_MODEL_LEN - 1] = 7
    assert proposer.propose([[], [7]], np.array([3, MAX_MODEL_LEN - 1]), rows) == [[], []]
    rows[1, :MAX_MODEL_LEN - 3] = 7
    assert [len(p) for p in proposer.propose([[1], [7]], np.array([3, MAX_MODEL_LEN - 3]), rows)] == [4, 2]


@pytest.mark.parametrize("section, message", [
    (None, "no \"specdecpp\" dict"),
    ({}, "'draft'] is missing"),
    ({"draft": "D", "heads": "H"}, "unknown fields ['heads']"),
    ({"draft": "D", "schedule": "oracle"}, "serves constant, heuristic, dynamic, ada"),
    ({"draft": "D", "schedule": "ada"}, "needs additional_config['specdecpp']['head']"),
    ({"draft": "D", "max_cached_requests": 0}, "max_cached_requests"),
])
def test_bad_configuration_names_the_field(section, message):
    with pytest.raises(ValueError, match=None) as error:
        ProposerConfig.from_additional_config(None if section is None else {"specdecpp": section})
    assert message in str(error.value)


def test_bad_models_and_knobs_fail_clearly(folders, tmp_path):
    wide = AcceptancePredictionHead(16, num_layers=1, alignment="proposer", features=["log_q"])
    wide.save_pretrained(tmp_path / "wide")
    head = str(folders["root"] / "head")
    with pytest.raises(ValueError, match=r"\['head'\].*hidden states of size 16"):
        make_proposer(folders, head=str(tmp_path / "wide"), stop_threshold=0.5)
    with pytest.raises(ValueError, match="vocabulary"):
        BatchProposer(ProposerConfig(draft=str(folders["root"] / "draft"), schedule="dynamic"), 5, MAX_MODEL_LEN, 65)
    with pytest.raises(ValueError, match="no stored threshold|has none"):
        make_proposer(folders, head=head, stop_threshold="auto")
    with pytest.raises(ValueError, match=r"additional_config\['specdecpp'\]\['bound'\]"):
        make_proposer(folders, head=head, stop_threshold=0.5, bound=(3, 1))
