#!/usr/bin/env bash
# The shipped head's recipe (benchmarks/learning_curve.sh hidden64) on more records: the 6,188 stdlib-train records
# plus records of the extra train-split prompts (extra_prompts.py), then scored and replayed on the dev records and
# on held-out functions 100-250 at the shipped head's stored compiled step times. From the repository root:
#   python results/more-records/extra_prompts.py data/generated/stdlib-train-extra-prompts.jsonl
#   torchrun --nproc_per_node 2 -m specdecpp.data.build_data --target checkpoints/zoo/target --draft checkpoints/zoo/draft \
#     --torch_dtype float32 --prompts data/generated/stdlib-train-extra-prompts.jsonl --max_new_tokens 128 \
#     --batch_size 16 --seed 0 --output data/generated/stdlib-train-extra.jsonl
#   bash results/more-records/train.sh NAME [N_EXTRA]   # head in outputs/more-records/NAME, N_EXTRA extra records
#   TRAIN_RECORDS=FILE bash results/more-records/train.sh NAME   # trained on FILE instead (distill_labels.py's)
# Settings from the environment: EPOCHS (10), LR (1e-2), WIDTH (64), STEP_TIMES_FROM (checkpoints/zoo/head: the
# results' runs priced every head with the previous head's, git archive 97da833 checkpoints/zoo/head).
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=$1
N_EXTRA=${2:-100000}
OUT=outputs/more-records/$NAME
RECORDS=${TRAIN_RECORDS:-outputs/more-records/data/train-$NAME.jsonl}
if [ -z "${TRAIN_RECORDS:-}" ]; then
  mkdir -p outputs/more-records/data
  cat data/generated/stdlib-train-train6188.jsonl > "$RECORDS"
  head -n "$N_EXTRA" data/generated/stdlib-train-extra.jsonl >> "$RECORDS"
fi
STEP_TIMES_FROM=${STEP_TIMES_FROM:-checkpoints/zoo/head}  # the shipped head's compiled step times, for every head
export OMP_NUM_THREADS=1
python -m specdecpp.train --model_name_or_path checkpoints/zoo/draft --target checkpoints/zoo/target \
  --torch_dtype float32 --data_path "$RECORDS" --eval_data_path data/generated/stdlib-train-dev.jsonl \
  --output_dir "$OUT" --weight_mismatch 1 --resnet_num_layers 3 --head_features none --head_width ${WIDTH:-64} \
  --cache_hidden_states --use_cpu --num_train_epochs ${EPOCHS:-10} --lr_scheduler_type cosine --learning_rate ${LR:-1e-2} \
  --warmup_steps 0.03 --weight_decay 0.0 --per_device_train_batch_size 8 --per_device_eval_batch_size 16 \
  --eval_strategy no --save_strategy no --logging_steps 50 --report_to none --seed 42
score() {  # score HEAD on RECORDS and replay its rounds, the report to REPORT, the chosen threshold into HEAD
  python -m specdecpp.calibration.report --head "$1" --draft checkpoints/zoo/draft --target checkpoints/zoo/target \
    --torch_dtype float32 --data_path "$2" --choose_threshold --bound 1 20 --batch_size 16 --output "$3" \
    --plot_path "$1/reliability.png" --threshold_plot_path "$1/threshold.png" --step_times_from "$STEP_TIMES_FROM"
}
score "$OUT" data/generated/stdlib-train-dev.jsonl "$OUT/calibration.json"
rm -rf "$OUT-heldout-copy" && cp -r "$OUT" "$OUT-heldout-copy"  # the held-out replay must not choose the threshold
score "$OUT-heldout-copy" data/generated/stdlib-heldout-100-250.jsonl "$OUT/calibration-heldout-100-250.json"
rm -rf "$OUT-heldout-copy"
