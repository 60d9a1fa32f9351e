"""Records to what the head reads (examples, batches, hidden states and features), and `predict` over records."""
from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm
from transformers import PreTrainedModel

from specdecpp.checks import check_head_fits_draft, hidden_size
from specdecpp.head.model import AcceptancePredictionHead, logit_features
from specdecpp.head.objective import IGNORE
from specdecpp.models import last_hidden_states, model_device, positions_from_mask

NO_CANDIDATE = -1  # `candidates` entry of positions that judge no drafted token


def make_example(record: dict, index: int, mixing_ratio: float, seed: int, alignment: str = "reader",
                 num_candidates: int = 0) -> dict:
    """`input_ids`, `labels` (p_acc where a drafted token is judged, IGNORE elsewhere) and, for a proposer, `candidates`
    (with `num_candidates`, one padded list per position, as `labels`). A reader's mixing draws: (seed, index) alone."""
    prefix, n = list(record["prefix"]), len(record["tokens"])
    if alignment == "proposer" and num_candidates:
        if "candidates" not in record:
            raise ValueError("training on candidates needs records with `candidates` (build_data --num_candidates)")
        width, ignored = range(num_candidates), [[IGNORE] * num_candidates] * (len(prefix) - 1)
        return {"input_ids": prefix + list(record["tokens"][:n - 1]),
                "labels": ignored + [[float(p[j]) if j < len(p) else IGNORE for j in width]
                                     for p in record["candidate_p_acc"]],
                "candidates": [[NO_CANDIDATE] * num_candidates] * len(ignored)
                              + [[c[j] if j < len(c) else NO_CANDIDATE for j in width] for c in record["candidates"]]}
    if alignment == "proposer":
        ignored = [IGNORE] * (len(prefix) - 1)
        return {"input_ids": prefix + list(record["tokens"][:n - 1]),
                "labels": ignored + [float(p) for p in record["p_acc"]],
                "candidates": [NO_CANDIDATE] * len(ignored) + list(record["draft"])}
    mixed = np.random.default_rng([seed, index]).random(n) < mixing_ratio
    z = np.where(mixed, record["tokens"], record["draft"])
    labels = np.where(mixed, IGNORE, np.asarray(record["p_acc"], dtype=np.float64))
    return {"input_ids": prefix + z.tolist(), "labels": [IGNORE] * len(prefix) + labels.tolist()}


def pad_batch(features: list[dict]) -> dict[str, torch.Tensor]:
    """Right-pad examples into tensors, `labels` padded with IGNORE."""
    width = max(len(f["labels"]) for f in features)

    def padded(name: str, fill: float, dtype: torch.dtype) -> torch.Tensor:
        rows = [torch.as_tensor(np.array(f[name]), dtype=dtype) for f in features]  # a copy: cached rows are read-only
        out = torch.full((len(rows), width, *rows[0].shape[1:]), fill, dtype=dtype)
        for row, values in enumerate(rows):
            out[row, : len(values)] = values
        return out

    batch = {"labels": padded("labels", IGNORE, torch.float32)}
    if "hidden_states" in features[0]:
        batch["hidden_states"] = padded("hidden_states", 0.0, torch.float32)
        if "features" in features[0]:
            batch["features"] = padded("features", 0.0, torch.float32)
        return batch
    batch["input_ids"] = padded("input_ids", 0, torch.long)
    lengths = torch.tensor([len(f["input_ids"]) for f in features])
    batch["attention_mask"] = (torch.arange(width)[None] < lengths[:, None]).long()
    if "candidates" in features[0]:
        batch["candidates"] = padded("candidates", NO_CANDIDATE, torch.long)
    return batch


def head_inputs(draft: PreTrainedModel, feature_names: list[str], input_ids: torch.Tensor,
                attention_mask: torch.Tensor, candidates: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The draft's last hidden states `[batch, seq, hidden]` and, for `feature_names`, each position's candidates'
    features (zeros where there is none): `[batch, seq, (candidates,) features]`, all from the same logits."""
    if not feature_names:
        return last_hidden_states(draft, input_ids, attention_mask), None
    out = draft(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions_from_mask(attention_mask),
                output_hidden_states=True, use_cache=False)
    candidates = candidates.to(out.logits.device)
    if candidates.dim() == out.logits.dim():
        probs = out.logits.float().softmax(-1)  # one softmax for all the candidates
        drawn = probs.gather(-1, candidates.clamp_min(0)) * (candidates >= 0)
        taken = drawn.cumsum(-1) - drawn  # each candidate's earlier siblings, in draw order
        features = torch.stack([logit_features(out.logits, column.clamp_min(0), feature_names, probs, before)
                                for column, before in zip(candidates.unbind(-1), taken.unbind(-1))], dim=-2)
    else:
        features = logit_features(out.logits, candidates.clamp_min(0), feature_names)
    return out.hidden_states[-1], features * (candidates >= 0)[..., None]


def judged_states(hidden: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
    """`hidden` repeated (a view) over `features`' candidate axis when they have one: each candidate's state."""
    if features is None or features.dim() == hidden.dim():
        return hidden
    return hidden.unsqueeze(-2).expand(*features.shape[:-1], hidden.shape[-1])


@torch.no_grad()
def predict(head: AcceptancePredictionHead, draft: PreTrainedModel, records: list[dict], mixing_ratio: float = 0.15,
            seed: int = 42, batch_size: int = 8, num_candidates: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`(labels, predictions)`: `p_acc` and the head's P(accept) at every labelled position of the records; with
    `num_candidates` (a proposer head), `[positions, num_candidates]`, IGNORE where a position has fewer."""
    check_head_fits_draft(head.hidden_size, hidden_size(draft.config))
    device = model_device(draft)
    head = head.to(device)
    labels, predictions = [], []
    for start in tqdm(range(0, len(records), batch_size), desc="scoring", unit="batch"):
        batch = pad_batch([make_example(r, start + i, mixing_ratio, seed, head.alignment, num_candidates)
                           for i, r in enumerate(records[start: start + batch_size])])
        hidden, features = head_inputs(draft, head.features, batch["input_ids"].to(device),
                                       batch["attention_mask"].to(device), batch.get("candidates", None))
        judged = head.accept_prob(judged_states(hidden, features), features).cpu()
        judged = judged.unsqueeze(-1).expand_as(batch["labels"]) if judged.dim() < batch["labels"].dim() else judged
        keep = (batch["labels"] != IGNORE).any(-1) if num_candidates else batch["labels"] != IGNORE
        labels.append(batch["labels"][keep].numpy())
        predictions.append(judged[keep].numpy())
    return np.concatenate(labels).astype(np.float64), np.concatenate(predictions).astype(np.float64)
