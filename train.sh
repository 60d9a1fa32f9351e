#!/usr/bin/env bash
# Train a v2 (proposer) acceptance prediction head: 3 residual layers reading the draft's state
# plus log q and the entropy of the proposing logits, plain BCE (weight 1), 3 epochs, cosine
# schedule, on data from data/gen_data.sh. The reference's head: add
# --head_alignment reader --weight_mismatch 6 --mixing_ratio 0.15 (later flags win).
#
#   bash train.sh [DRAFT] [TRAIN_DATA] [DEV_DATA] [OUTPUT_DIR] [extra TrainingArguments flags...]
#
# NPROC [GPUs, or 1] ranks; DEEPSPEED=configs/ds_zero2.json to train under DeepSpeed ZeRO-2;
# REPORT_TO [none] e.g. wandb. On GPUs add --bf16; on a CPU add --use_cpu and consider
# --cache_hidden_states (the frozen draft runs once instead of once per epoch).
# Later flags override earlier ones, so extra flags can change any default below.
set -euo pipefail
cd "$(dirname "$0")"

DRAFT=${1:-meta-llama/Llama-2-7b-chat-hf}
TRAIN_DATA=${2:-data/generated/alpaca-train.jsonl}
DEV_DATA=${3:-data/generated/alpaca-dev.jsonl}
OUTPUT_DIR=${4:-heads/$(basename "$DRAFT")}
shift $(( $# < 4 ? $# : 4 ))
NPROC=${NPROC:-$(python -c "import torch; print(max(torch.cuda.device_count(), 1))")}
DS_FLAG=${DEEPSPEED:+--deepspeed $DEEPSPEED}

torchrun --nproc_per_node "$NPROC" specdecpp/train.py \
  --draft "$DRAFT" --records "$TRAIN_DATA" --eval_records "$DEV_DATA" --output "$OUTPUT_DIR" \
  --weight_mismatch 1 --resnet_num_layers 3 \
  --num_train_epochs 3 --lr_scheduler_type cosine --learning_rate 1e-3 --warmup_steps 0.03 --weight_decay 0.0 \
  --per_device_train_batch_size 4 --per_device_eval_batch_size 8 \
  --eval_strategy epoch --save_strategy epoch --save_total_limit 2 --logging_steps 10 \
  --report_to "${REPORT_TO:-none}" $DS_FLAG "$@"
