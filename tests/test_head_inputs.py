"""What the head reads: training's inputs (`head_inputs`, teacher-forced) are the engine's (one
draft step at a time through the cache), position by position."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from specdecpp.engine.draft_step import EagerDraft
from specdecpp.engine.processing import sampling_only
from specdecpp.head.inputs import head_inputs
from specdecpp.head.model import FEATURES, step_features


@pytest.mark.parametrize("do_sample", [False, True])
@torch.no_grad()
def test_every_feature_is_the_same_in_training_and_in_the_engine(do_sample):
    draft = tiny_llama(seed=3).eval()
    names = list(FEATURES)
    sequence = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    generator = torch.Generator().manual_seed(1)
    cached = EagerDraft(draft, sampling_only(do_sample), with_hidden_states=True)
    candidates, engine_hidden, engine_features = [], [], []
    for length in range(1, len(sequence)):  # the step that proposes the token after sequence[:length]
        step = cached.draft_step(sequence[:length], 1, generator)
        candidates.append(step.token)
        engine_hidden.append(step.hidden.float())
        engine_features.append(step_features(step.logits, step.raw_probs, step.token, names))
    ids = torch.tensor([sequence[:-1]])
    hidden, features = head_inputs(draft, names, ids, torch.ones_like(ids), torch.tensor([candidates]))
    torch.testing.assert_close(hidden[0].float(), torch.stack(engine_hidden).reshape(hidden.shape[1:]),
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(features[0], torch.tensor(engine_features), rtol=1e-4, atol=1e-4)
    assert len(set(candidates)) > 3  # varied proposals, sampled ones differ from the argmax
