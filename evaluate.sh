#!/usr/bin/env bash
# The full evaluation on the embedded pair: our schedules over K and thresholds, next to the target
# alone, the draft alone and Hugging Face's own constant/heuristic/dynamic assisted generation, all
# interleaved per prompt in one run. Extra flags are passed on, e.g.
#   ./evaluate.sh --n_end 20 --max_new_tokens 64 --save_path outputs/quick
#   ./evaluate.sh --data_path stdlib-heldout --save_path results/stdlib-heldout
set -euo pipefail
cd "$(dirname "$0")"
python specdecpp/evaluate.py \
    --model_name checkpoints/zoo/target \
    --assistant_name checkpoints/zoo/draft \
    --assist_acc_head_dir checkpoints/zoo/head \
    --schedule constant heuristic dynamic ada \
    --num_assistant_tokens 1 2 3 4 5 6 \
    --stop_threshold 0.1 0.2 0.3 0.5 0.7 0.9 \
    --bound 2 20 \
    --data_path humaneval \
    --max_new_tokens 128 \
    --torch_dtype float32 \
    --threads 1 \
    --save_path results/humaneval \
    "$@"
