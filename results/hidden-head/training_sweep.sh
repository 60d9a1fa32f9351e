# Five trainings of the shipped head's net beside it (seed, epochs, learning rate, batch size), each calibrated
# with the shipped head's stored step times, so that the replays differ only in the predictions. From the
# repository root, after benchmarks/learning_curve.sh hidden64 6188:  bash results/hidden-head/training_sweep.sh
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
for V in "s43 10 1e-2 43 8" "e20 20 1e-2 42 8" "lr5 10 5e-3 42 8" "lr2 10 2e-2 42 8" "b32 20 2e-2 42 32"; do
  set -- $V; NAME=hidden64$1; EP=$2; LR=$3; SEED=$4; BS=$5
  OUT=outputs/curve/$NAME-6188
  if [ ! -f $OUT/model.safetensors ]; then
  python -m specdecpp.train --model_name_or_path checkpoints/zoo/draft --target checkpoints/zoo/target \
    --torch_dtype float32 --data_path outputs/curve/data/train-6188.jsonl --eval_data_path data/generated/stdlib-train-dev.jsonl \
    --output_dir "$OUT" --weight_mismatch 1 --resnet_num_layers 3 --head_features none --head_width 64 --cache_hidden_states --use_cpu \
    --num_train_epochs $EP --lr_scheduler_type cosine --learning_rate $LR --warmup_steps 0.03 --weight_decay 0.0 \
    --per_device_train_batch_size $BS --per_device_eval_batch_size 16 --eval_strategy no --save_strategy no \
    --logging_steps 50 --report_to none --seed $SEED --disable_tqdm true > /dev/null 2>&1
  fi
  echo "$NAME $(python -c "import json;print(json.load(open('$OUT/card.json'))['eval_metrics']['eval_loss'])")"
  python -m specdecpp.calibration.report --head $OUT --draft checkpoints/zoo/draft --target checkpoints/zoo/target \
    --torch_dtype float32 --data_path data/generated/stdlib-train-dev.jsonl --choose_threshold --bound 1 20 --batch_size 16 \
    --step_times_from checkpoints/zoo/head --output outputs/cal-$NAME.json 2>&1 | grep -a "AUROC\|stop threshold"
done
