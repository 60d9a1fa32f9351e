#!/usr/bin/env bash
# Build the acceptance head's training and dev data for a target/draft pair (the reference's gen_data.sh).
#
#   bash data/gen_data.sh [TARGET] [DRAFT]
#
# Settings come from the environment (defaults in brackets):
#   NPROC [GPUs, or 1]             ranks: torchrun --nproc_per_node NPROC, each builds its share of the prompts
#   DATASET [tatsu-lab/alpaca]     prompts: a Hub dataset, a .json/.jsonl file, or a registered set (humaneval)
#   N_TRAIN [2000] N_DEV [200]     prompts [0, N_TRAIN) for training, [N_TRAIN, N_TRAIN + N_DEV) for dev
#   MAX_NEW_TOKENS [512] BATCH_SIZE [8] SEED [0]
#   DO_SAMPLE [0]                  1: sampling mode (soft labels p_acc = min(1, p/q)); 0: greedy (0/1 labels)
#   PROMPT_FORMAT [auto]           auto | raw | chat | llama2 (the reference's [INST] ... [/INST])
#   OUT_DIR [data/generated]       where TRAIN/DEV files go: OUT_DIR/<dataset>-{train,dev}.jsonl
# Extra build-data flags (e.g. --torch_dtype bfloat16 --device auto) go in EXTRA_ARGS.
# An interrupted run resumes where it stopped when rerun with the same settings.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${1:-meta-llama/Llama-2-70b-chat-hf}
DRAFT=${2:-meta-llama/Llama-2-7b-chat-hf}
NPROC=${NPROC:-$(python -c "import torch; print(max(torch.cuda.device_count(), 1))")}
DATASET=${DATASET:-tatsu-lab/alpaca}
N_TRAIN=${N_TRAIN:-2000}
N_DEV=${N_DEV:-200}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-512}
BATCH_SIZE=${BATCH_SIZE:-8}
SEED=${SEED:-0}
PROMPT_FORMAT=${PROMPT_FORMAT:-auto}
OUT_DIR=${OUT_DIR:-data/generated}
SAMPLE_FLAG=$([ "${DO_SAMPLE:-0}" = 1 ] && echo --do_sample || true)
NAME=$(basename "${DATASET%.*}")
mkdir -p "$OUT_DIR"

build() {  # build SPLIT N_BEGIN N_END
  local out="$OUT_DIR/$NAME-$1.jsonl"
  if [ -f "$out" ]; then echo "$out exists, skipping (delete it to rebuild)"; return; fi
  torchrun --nproc_per_node "$NPROC" -m specdecpp.data.build_data \
    --target "$TARGET" --draft "$DRAFT" --prompts "$DATASET" --output "$out" \
    --n_begin "$2" --n_end "$3" --max_new_tokens "$MAX_NEW_TOKENS" --batch_size "$BATCH_SIZE" --seed "$SEED" \
    --prompt_format "$PROMPT_FORMAT" $SAMPLE_FLAG ${EXTRA_ARGS:-}
}

build train 0 "$N_TRAIN"
build dev "$N_TRAIN" "$((N_TRAIN + N_DEV))"
echo "train: $OUT_DIR/$NAME-train.jsonl  dev: $OUT_DIR/$NAME-dev.jsonl"
