"""Records whose labels mix each position's own label with a teacher head's prediction there,
`p_acc = keep * p_acc + (1 - keep) * teacher`, so that a narrow head can learn from a wide one (the shipped head
learnt a 256-wide one's predictions, keep 0: `checkpoints/zoo/head/card.json`, training).

    python benchmarks/distill_labels.py TEACHER RECORDS.jsonl OUT.jsonl [--keep 0.0]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from harness import DRAFT

from specdecpp.data.io import read_records, write_records
from specdecpp.head.inputs import predict
from specdecpp.models import load_head, load_model


def main(argv: list[str] | None = None) -> list[dict]:
    """Write the records with the mixed labels, and return them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("teacher", help="the teacher head's folder")
    parser.add_argument("records", help="the records to relabel")
    parser.add_argument("output", help="the relabelled records file")
    parser.add_argument("--keep", type=float, default=0.0, help="the weight of each position's own label")
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    records = read_records(args.records)
    draft = load_model(args.draft, torch_dtype=torch.float32)
    labels, predictions = predict(load_head(args.teacher), draft, records, batch_size=16)
    own = [np.asarray(record["p_acc"], dtype=np.float64) for record in records]
    if not np.allclose(labels, np.concatenate(own)):
        raise RuntimeError("predict returned the positions in another order than the records'")
    for record, label, taught in zip(records, own, np.split(predictions, np.cumsum([len(x) for x in own])[:-1])):
        record["p_acc"] = (args.keep * label + (1 - args.keep) * taught).tolist()
    write_records(args.output, records)
    print(f"{len(records)} records, {len(labels)} labels ({args.keep:g} own, {1 - args.keep:g} {args.teacher}) "
          f"-> {args.output}")
    return records


if __name__ == "__main__":
    main()
