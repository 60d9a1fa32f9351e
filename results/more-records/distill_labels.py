"""Records whose labels mix each position's own label with a teacher head's prediction there:
`p_acc = keep * p_acc + (1 - keep) * teacher`, so that a narrow head can learn from a wide one. From the repository
root:

    python results/more-records/distill_labels.py TEACHER RECORDS.jsonl OUT.jsonl [KEEP]
"""
import sys

import torch

from specdecpp.data.io import read_records, write_records
from specdecpp.head.inputs import predict
from specdecpp.models import load_head, load_model


def main(teacher: str, path: str, output: str, keep: float = 0.0) -> None:
    torch.set_num_threads(2)
    records = read_records(path)
    draft = load_model("checkpoints/zoo/draft", torch_dtype=torch.float32)
    labels, predictions = predict(load_head(teacher), draft, records, batch_size=16)
    start = 0
    for record in records:
        n = len(record["p_acc"])
        assert list(labels[start:start + n]) == [float(p) for p in record["p_acc"]], "labels out of order"
        record["p_acc"] = [keep * float(p) + (1 - keep) * float(s)
                           for p, s in zip(record["p_acc"], predictions[start:start + n])]
        start += n
    assert start == len(labels)
    write_records(output, records)
    print(f"{len(records)} records, {start} labels ({keep:g} own, {1 - keep:g} {teacher}) -> {output}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *map(float, sys.argv[4:]))
