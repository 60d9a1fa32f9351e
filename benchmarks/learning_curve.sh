#!/usr/bin/env bash
# The head's learning curve and input ablations on the zoo pair: train a head on the first
# N stdlib-train records for each N, then score it and choose its threshold on the dev records.
#
#   bash benchmarks/learning_curve.sh SET "200 400 800 1600 3200 6188"
#   DATA=sampled-t1 STEP_TIMES=benchmarks/step_times/flat.json bash benchmarks/learning_curve.sh rank "800 3200"
#
# SET picks the head's inputs: v2 (hidden state + log q + entropy, the zoo recipe), margin (+ the
# top-1/top-2 margin), margin1 (margin with one residual block instead of three: a cheaper judgement),
# margin10 (margin trained 10 epochs at 3e-3), margin64 (margin with the inputs projected to 64-wide blocks, fewer
# weights per judgement; 10 epochs at 1e-2), hidden64, hidden128 and hidden10 (margin64's net, one 128 wide, and
# margin10's, on the hidden state alone: no logit features to compute per judgement),
# logits (log q + entropy + margin, no hidden state; learning rate 1e-2), rank (margin + the sampled
# token's log rank, for sampling). Heads go to outputs/curve/SET-N, or outputs/curve/DATA-SET-N for
# the records data/generated/stdlib-train-DATA-{train,dev}.jsonl (DATA=sampled-t1: sampled at
# temperature 1), with calibration.json; `python
# benchmarks/learning_curve.py` tabulates them. Thresholds are chosen with the step times in
# STEP_TIMES (default: benchmarks/step_times/cpu.json, measured on a 2-core CPU; the sampling
# heads use benchmarks/step_times/flat.json, flat GPU-like prices).
# Data (greedy, 128 tokens, all 6,338 stdlib-train prompts; train = prompts 0-800 and 950-6338, in that
# order, so that the first N records are the same for every N; dev = 800-950):
#   python -m specdecpp.data.build_data --target checkpoints/zoo/target --draft checkpoints/zoo/draft --torch_dtype float32 \
#     --prompts stdlib-train --max_new_tokens 128 --batch_size 16 --seed 0 --output data/generated/stdlib-train-all.jsonl
#   sed -n '1,800p;951,6338p' data/generated/stdlib-train-all.jsonl > data/generated/stdlib-train-train6188.jsonl
#   sed -n '801,950p' data/generated/stdlib-train-all.jsonl > data/generated/stdlib-train-dev.jsonl
# Every head is priced with the same step times (benchmarks/step_times/cpu.json, measured on a
# quiet machine), so that load on the machine cannot reorder them; STEP_TIMES may also name a head folder (its
# stored step times). Other records and heads (the shipped head's: checkpoints/zoo/head/card.json):
#   TRAIN    the records file whose first N records train (default: the DATA set's train records)
#   NAME     the heads' folder name before -N, instead of [DATA-]SET
#   WIDTH    the hidden sets' block width (64, 128; the zoo recipe's teacher: 256)
#   HELDOUT  records also replayed, on a copy of the head, into calibration-heldout.json (the copy, so that the
#            held-out replay does not choose the stored threshold)
set -euo pipefail
cd "$(dirname "$0")/.."
SET=$1
SIZES=${2:-"200 400 800 1600 3200 6188"}
case $SET in
  v2) INPUTS="--head_features log_q entropy" ;;
  margin) INPUTS="--head_features log_q entropy margin" ;;
  margin1) INPUTS="--head_features log_q entropy margin"
           LAYERS=1 ;;
  margin10) INPUTS="--head_features log_q entropy margin"
            LR=${LR:-3e-3} EPOCHS=${EPOCHS:-10} ;;  # margin, trained longer
  margin64) INPUTS="--head_features log_q entropy margin --head_width 64"
            LR=${LR:-1e-2} EPOCHS=${EPOCHS:-10} ;;  # the narrow net trains best fast and long
  hidden64) INPUTS="--head_features none --head_width ${WIDTH:-64}"
            LR=${LR:-1e-2} EPOCHS=${EPOCHS:-10} ;;  # the proposer's state determines its logits, so its token too
  hidden128) INPUTS="--head_features none --head_width ${WIDTH:-128}"
             LR=${LR:-5e-3} EPOCHS=${EPOCHS:-10} ;;
  hidden10) INPUTS="--head_features none"
            LR=${LR:-3e-3} EPOCHS=${EPOCHS:-10} ;;
  logits) INPUTS="--head_features log_q entropy margin --head_reads_hidden_states false"
          LR=1e-2 ;;  # three inputs: at 1e-3 the small net barely leaves its initialisation in 3 epochs
  rank) INPUTS="--head_features log_q entropy margin log_rank" ;;
  *) echo "unknown SET $SET (v2, margin, margin1, margin10, margin64, hidden64, hidden128, hidden10, logits, rank)"; exit 2 ;;
esac
RECORDS_PREFIX=data/generated/stdlib-train${DATA:+-$DATA}
if [ -n "${DATA:-}" ]; then DEFAULT_TRAIN=$RECORDS_PREFIX-train.jsonl; else DEFAULT_TRAIN=$RECORDS_PREFIX-train6188.jsonl; fi
TRAIN=${TRAIN:-$DEFAULT_TRAIN}
RECORDS_STEM=outputs/curve/data/${NAME:+$NAME-}${DATA:+$DATA-}train  # each head's first N records go to STEM-N.jsonl
NAME=${NAME:-${DATA:+$DATA-}$SET}
STEP_TIMES=${STEP_TIMES:-benchmarks/step_times/cpu.json}
export OMP_NUM_THREADS=1
score() {  # score HEAD on RECORDS and replay its rounds into REPORT, choosing HEAD's stored threshold
  python -m specdecpp.calibration.report --head "$1" --draft checkpoints/zoo/draft --target checkpoints/zoo/target \
    --torch_dtype float32 --data_path "$2" --choose_threshold --bound 1 20 \
    --batch_size 16 --plot_path "$1/reliability.png" --threshold_plot_path "$1/threshold.png" \
    --output "$3" --step_times_from "$STEP_TIMES"
}
for N in $SIZES; do
  OUT=outputs/curve/$NAME-$N
  if [ -f "$OUT/calibration.json" ]; then echo "$OUT done, skipping"; continue; fi
  mkdir -p outputs/curve/data
  RECORDS=$RECORDS_STEM-$N.jsonl
  head -n "$N" "$TRAIN" > "$RECORDS"
  python -m specdecpp.train --model_name_or_path checkpoints/zoo/draft --target checkpoints/zoo/target \
    --torch_dtype float32 --data_path "$RECORDS" --eval_data_path "$RECORDS_PREFIX-dev.jsonl" \
    --output_dir "$OUT" --weight_mismatch 1 --resnet_num_layers ${LAYERS:-3} $INPUTS --cache_hidden_states --use_cpu \
    --num_train_epochs ${EPOCHS:-3} --lr_scheduler_type cosine --learning_rate ${LR:-1e-3} --warmup_steps 0.03 --weight_decay 0.0 \
    --per_device_train_batch_size 8 --per_device_eval_batch_size 16 --eval_strategy no --save_strategy no \
    --logging_steps 50 --report_to none --seed 42
  score "$OUT" "$RECORDS_PREFIX-dev.jsonl" "$OUT/calibration.json"
  if [ -n "${HELDOUT:-}" ]; then
    rm -rf "$OUT-heldout" && cp -r "$OUT" "$OUT-heldout"
    score "$OUT-heldout" "$HELDOUT" "$OUT/calibration-heldout.json"
    rm -rf "$OUT-heldout"
  fi
done
