"""Records whose labels mix each position's own label with a teacher head's prediction there:
`p_acc = keep * p_acc + (1 - keep) * teacher`, so that a narrow head can learn from a wide one. From the repository
root:

    python results/more-records/distill_labels.py TEACHER RECORDS.jsonl OUT.jsonl [KEEP]
"""
import sys

import numpy as np
import torch

from specdecpp.data.io import read_records, write_records
from specdecpp.head.inputs import predict
from specdecpp.models import load_head, load_model


def main(teacher: str, path: str, output: str, keep: float = 0.0) -> None:
    torch.set_num_threads(2)
    records = read_records(path)
    draft = load_model("checkpoints/zoo/draft", torch_dtype=torch.float32)
    labels, predictions = predict(load_head(teacher), draft, records, batch_size=16)
    own = [np.asarray(record["p_acc"], dtype=np.float64) for record in records]
    assert np.allclose(labels, np.concatenate(own)), "predict returned the positions in another order"
    for record, label, taught in zip(records, own, np.split(predictions, np.cumsum([len(x) for x in own])[:-1])):
        record["p_acc"] = (keep * label + (1 - keep) * taught).tolist()
    write_records(output, records)
    print(f"{len(records)} records, {len(labels)} labels ({keep:g} own, {1 - keep:g} {teacher}) -> {output}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *map(float, sys.argv[4:]))
