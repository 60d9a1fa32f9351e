"""Try a draft recipe against the committed zoo target without rebuilding the target.

Distils a fresh draft from `checkpoints/zoo/target` exactly as `specdecpp zoo build` does after
its target phase (same corpus, initialisation, schedule and seed), with the draft options given
(`--draft_minutes`, `--draft_lr`, `--draft_hard_label_weight`, ...), saves it to
`<output>/draft` and prints the card's figures and target verdicts for the pair. A 60-minute
build spends ~44 minutes on the target, so this answers "which draft recipe?" in the remaining
minutes instead of a whole build.

    python benchmarks/zoo_draft_recipe.py --output /tmp/draft --draft_minutes 12 --draft_hard_label_weight 1
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from transformers import AutoTokenizer, HfArgumentParser

from specdecpp.training import zoo

TARGET = Path(__file__).resolve().parent.parent / "checkpoints" / "zoo" / "target"


def main() -> None:
    (args,) = HfArgumentParser(zoo.ZooArguments).parse_args_into_dataclasses()
    out = Path(args.output)
    if out.resolve() == TARGET.parent.resolve():
        raise SystemExit("--output must not be checkpoints/zoo: this script writes a trial draft")
    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    stream = zoo.encode_corpus(tokenizer, zoo.train_texts(args))
    draft, log = zoo.distill_draft(zoo.load_zoo_model(TARGET, args.device), tokenizer, stream, args)
    zoo.save_model(draft, tokenizer, out / "draft")
    figures = zoo.evaluate_pair(TARGET, out / "draft", args)
    print(json.dumps({"args": asdict(args), "training": log, "figures": figures,
                      "targets": zoo.check_targets(figures)}, indent=2))


if __name__ == "__main__":
    main()
