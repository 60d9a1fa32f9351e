#!/usr/bin/env bash
# The full evaluation on the embedded pair: SpecDec++ with the zoo head (its stored threshold `auto`
# and a grid) and with the reference-aligned head, next to the target alone, our constant K 1-6,
# the draft-confidence `dynamic` schedule at several confidence thresholds, Hugging Face's own
# dynamic assisted generation, and the oracle (greedy) as the ceiling, all interleaved per prompt
# in one run. Extra flags are passed on, e.g.
#   ./evaluate.sh --n_end 20 --max_new_tokens 64 --output outputs/quick
#   ./evaluate.sh --prompts stdlib-heldout --output outputs/stdlib-heldout
#   ./evaluate.sh --do_sample --seed 0 --schedule constant dynamic ada --output outputs/humaneval-sampled
# An --output that already holds results needs --resume (finish that run) or --overwrite (start again).
# The reference's flag names (--model_name, --assistant_name, --assist_acc_head_dir, --data_path,
# --save_path, --random_seed) work too.
set -euo pipefail
cd "$(dirname "$0")"
python specdecpp/evaluate.py \
    --target checkpoints/zoo/target \
    --draft checkpoints/zoo/draft \
    --head checkpoints/zoo/head checkpoints/zoo/head-reference \
    --schedule constant dynamic ada oracle \
    --num_assistant_tokens 1 2 3 4 5 6 \
    --assistant_confidence_threshold 0.4 0.2 0.6 \
    --stop_threshold auto 0.2 0.3 0.5 0.7 \
    --bound 1 20 \
    --baselines target hf:dynamic \
    --prompts humaneval \
    --max_new_tokens 128 \
    --torch_dtype float32 \
    --threads 1 \
    --output outputs/humaneval \
    "$@"
