"""What the head reads: training's inputs (`head_inputs`, teacher-forced) are the engine's (one
draft step at a time through the cache), position by position, and so is its judgement."""
from __future__ import annotations

import pytest
import torch
from conftest import randomized, tiny_llama

from specdecpp import AcceptancePredictionHead
from specdecpp.engine.draft_step import EagerDraft
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.schedules import AdaTree
from specdecpp.head.inputs import head_inputs, judged_states
from specdecpp.head.model import FEATURES, LeanJudge, logit_features


@pytest.mark.parametrize("do_sample", [False, True])
@torch.no_grad()
def test_every_feature_is_the_same_in_training_and_in_the_engine(do_sample):
    draft = tiny_llama(seed=3).eval()
    names = list(FEATURES)
    sequence = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(2)
    head = randomized(AcceptancePredictionHead(draft.config.hidden_size, 2, alignment="proposer", features=names))
    with torch.no_grad():
        head.output()[0].mul_(0.01)  # P(accept) away from 0 and 1, where it shows what the head reads
    cached = EagerDraft(draft, sampling_only(do_sample), LeanJudge(head))
    candidates, engine_hidden, engine_features, engine_judged = [], [], [], []
    for length in range(1, len(sequence)):  # the step that proposes the token after sequence[:length]
        step = cached.draft_step(sequence[:length], 1, generator)
        candidates.append(step.token)
        engine_hidden.append(step.hidden.float())
        engine_features.append(logit_features(step.logits, torch.tensor(step.token), names, None if step.warped else step.probs))
        engine_judged.append(step.accept_prob)
    ids = torch.tensor([sequence[:-1]])
    hidden, features = head_inputs(draft, names, ids, torch.ones_like(ids), torch.tensor([candidates]))
    torch.testing.assert_close(hidden[0].float(), torch.stack(engine_hidden).reshape(hidden.shape[1:]),
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(features[0], torch.stack(engine_features), rtol=1e-4, atol=1e-4)
    expected = head.accept_prob(hidden[0], features[0]).double()
    torch.testing.assert_close(torch.tensor(engine_judged, dtype=torch.float64), expected, rtol=1e-4, atol=1e-5)
    assert expected.std() > 0.01  # the judgement varies with what the head reads
    assert len(set(candidates)) > 3  # varied proposals, sampled ones differ from the argmax


@pytest.mark.parametrize("do_sample", [False, True])
@torch.no_grad()
def test_a_siblings_judgement_is_the_same_in_training_and_in_the_engine(do_sample):
    """Each candidate of a position, judged as `ada-tree` judges a node's children (one `LeanJudge` call, each
    after its earlier siblings' draft mass) from the step that proposed the drafted token, gets the P(accept)
    training gives it (`head_inputs` with a candidate axis, `judged_states`)."""
    draft = tiny_llama(seed=4).eval()
    names = ["log_q", "margin", "log_rank", "log_left"]
    sequence = torch.randint(0, 64, (10,), generator=torch.Generator().manual_seed(5)).tolist()
    torch.manual_seed(6)
    head = randomized(AcceptancePredictionHead(draft.config.hidden_size, 2, alignment="proposer", features=names,
                                               width=8))
    with torch.no_grad():
        head.output()[0].mul_(0.01)
    judge = LeanJudge(head)
    policy = AdaTree(head, 4, 8, 0.5, (1, 4), do_sample)
    cached = EagerDraft(draft, sampling_only(do_sample), judge)
    candidates, engine_judged = [], []
    for length in range(1, len(sequence)):
        step = cached.draft_step(sequence[:length], 1, torch.Generator().manual_seed(length))
        siblings = torch.tensor([step.token] + [t for t in step.logits.topk(4).indices.tolist() if t != step.token][:3])
        candidates.append(siblings.tolist())
        [scores] = policy.score_children(step.logits[None], step.probs[None], None, step.hidden.float()[None],
                                         siblings[None]).tolist()
        engine_judged.append(torch.tensor(scores))
        assert abs(scores[0] - step.accept_prob) < 1e-5, "the drafted token's own judgement"
    ids = torch.tensor([sequence[:-1]])
    hidden, features = head_inputs(draft, names, ids, torch.ones_like(ids), torch.tensor([candidates]))
    assert features.shape == (1, len(candidates), 4, len(names))
    trained = head.accept_prob(judged_states(hidden, features), features)[0]
    torch.testing.assert_close(trained, torch.stack(engine_judged).float(), rtol=1e-4, atol=1e-5)
    assert (features[0, :, 1:, -1] < 0).all() and (features[0, :, 0, -1] == 0).all(), "log_left: siblings after"
    assert (trained.std(-1) > 1e-3).all(), "siblings of one state are told apart by their features"
