"""Try a draft recipe against the committed zoo target without rebuilding the target.

Distils a fresh draft from `checkpoints/zoo/target` exactly as `specdecpp zoo build` does after
its target phase (same corpus, initialisation, schedule and seed), with the draft options given
(`--draft_minutes`, `--draft_lr`, `--draft_hard_label_weight`, ...), saves it to
`<output_dir>/draft` and prints the card's figures and target verdicts for the pair. A 60-minute
build spends ~44 minutes on the target, so this answers "which draft recipe?" in the remaining
minutes instead of a whole build.

    python benchmarks/zoo_draft_recipe.py --output_dir /tmp/draft --draft_minutes 12 --draft_hard_label_weight 1
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from transformers import AutoTokenizer, HfArgumentParser

from specdecpp import stdlib_corpus, zoo

TARGET = Path(__file__).resolve().parent.parent / "checkpoints" / "zoo" / "target"


def main() -> None:
    (args,) = HfArgumentParser(zoo.ZooArguments).parse_args_into_dataclasses()
    out = Path(args.output_dir)
    if out.resolve() == TARGET.parent.resolve():
        raise SystemExit("--output_dir must not be checkpoints/zoo: this script writes a trial draft")
    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    texts = [text for _, text in stdlib_corpus.read_split("train")][:args.max_train_files or None]
    stream = zoo.encode_corpus(tokenizer, texts)
    target = zoo.load_model(TARGET, args.device).requires_grad_(False)
    draft = zoo.draft_from_target(target, zoo.llama_config(args, args.draft_layers, tokenizer))
    log = zoo.train(draft, zoo.distill_loss(target, args.draft_hard_label_weight), stream, args, args.draft_steps,
                    args.draft_minutes, args.draft_lr, "draft", args.seed + 1)
    zoo.save_model(draft, tokenizer, out / "draft")
    figures = zoo.evaluate_pair(TARGET, out / "draft", args)
    print(json.dumps({"args": asdict(args), "training": log, "figures": figures,
                      "targets": zoo.check_targets(figures)}, indent=2))


if __name__ == "__main__":
    main()
