"""Head shapes and training recipes compared on the zoo pair's records (exploration; the shipped head is trained by
`specdecpp.train`). The head's inputs are cached once (`outputs/narrow-head/cache`), then each variant
WIDTH,BLOCKS,LR,EPOCHS (WIDTH `full`: no projection) trains with AdamW, batches of 1,024 positions, a cosine schedule
after 3% warm-up and plain BCE, as `specdecpp.train` with `--weight_mismatch 1` does; printed: AUROC and BCE on the
dev records. From the repository root:

    python results/narrow-head/explore.py outputs/curve/data/train-3200.jsonl full,3,1e-3,3 64,3,1e-2,10
"""
import math
import os
import sys
import time

import numpy as np
import torch
from datasets import Dataset
from sklearn.metrics import roc_auc_score

from specdecpp.data.io import read_records
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.models import load_model
from specdecpp.train import cache_hidden_states, examples_dataset

FEATURES = ["log_q", "entropy", "margin"]


def head_inputs(split: str, records: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states, features and labels of every labelled position of `records`, cached under `split`."""
    cache = f"outputs/narrow-head/cache/{split}"
    if not os.path.exists(cache + "/rank0"):
        draft = load_model("checkpoints/zoo/draft", torch_dtype="float32")
        examples = examples_dataset(read_records(records), 0.15, 42, "proposer")
        cache_hidden_states(draft, FEATURES, examples, cache, 16, torch.device("cpu"))
    rows = Dataset.load_from_disk(cache + "/rank0").with_format("numpy")
    return tuple(torch.from_numpy(np.concatenate(list(rows[name]))) for name in ("hidden_states", "features", "labels"))


def train_and_score(train, dev, width: int | None, blocks: int, lr: float, epochs: int, batch: int = 1024) -> str:
    torch.manual_seed(42)
    head = AcceptancePredictionHead(256, blocks, alignment="proposer", features=FEATURES, width=width)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    n = len(train[2])
    steps = epochs * math.ceil(n / batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1, s / (0.03 * steps)) * 0.5
                                                 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    start = time.time()
    for _ in range(epochs):
        order = torch.randperm(n)
        for i in range(0, n, batch):
            index = order[i:i + batch]
            loss = torch.nn.functional.cross_entropy(head(train[0][index], train[1][index]), train[2][index].long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    with torch.no_grad():
        p = head.accept_prob(dev[0], dev[1]).numpy().clip(1e-7, 1 - 1e-7)
    y = dev[2].numpy()
    bce = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    return (f"auroc {roc_auc_score(y, p):.4f} bce {bce:.4f} params {sum(t.numel() for t in head.parameters())} "
            f"{time.time() - start:.0f}s")


if __name__ == "__main__":
    torch.set_num_threads(1)
    train = head_inputs("train", sys.argv[1])
    dev = head_inputs("dev", "data/generated/stdlib-train-dev.jsonl")
    print("train positions", len(train[2]), "dev", len(dev[2]), flush=True)
    for spec in sys.argv[2:]:
        width, blocks, lr, epochs = spec.split(",")
        print(f"{spec:28s}", train_and_score(train, dev, None if width == "full" else int(width), int(blocks),
                                             float(lr), int(epochs)), flush=True)
