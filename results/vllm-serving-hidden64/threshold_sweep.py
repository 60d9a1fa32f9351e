"""`benchmarks/vllm_serving.py` with `ada` also at thresholds 0.15, 0.35, 0.5, 0.7 and 0.85 (bound [1, 20]) and at
`auto` with bound [2, 20], without ngram. From the repository root, in the serving environment:

    python results/vllm-serving-hidden64/threshold_sweep.py --prompt_sets stdlib-heldout --concurrency 4 16 \
        --methods "vLLM, no speculation" "vLLM draft_model K=2" "vLLM draft_model K=3" "ours ada@auto" \
        "ours ada@0.5" "ours ada@0.7" "ours ada@0.85" --output outputs/vllm-sweep
    python results/vllm-serving-hidden64/threshold_sweep.py --concurrency 1 4 16 \
        --methods "vLLM, no speculation" "vLLM draft_model K=2" "vLLM draft_model K=3" "ours ada@auto" \
        "ours ada@auto min2" "ours ada@0.35" "ours ada@0.15" --output outputs/vllm-sweep2
"""
import sys

sys.path.insert(0, "benchmarks")
import vllm_serving  # noqa: E402

methods = vllm_serving.methods


def with_thresholds(zoo):
    grid = methods(zoo)
    head = lambda threshold, bound: {"specdecpp": {"head": str(zoo / "head"), "stop_threshold": threshold,  # noqa: E731
                                                   "bound": bound}}
    for threshold in (0.15, 0.35, 0.5, 0.7, 0.85):
        grid[f"ours ada@{threshold}"] = {"speculative_config": grid["ours ada@auto"]["speculative_config"],
                                         "additional_config": head(threshold, [1, 20])}
    grid["ours ada@auto min2"] = {"speculative_config": grid["ours ada@auto"]["speculative_config"],
                                  "additional_config": head("auto", [2, 20])}
    grid.pop("vLLM ngram K=5")
    return grid


vllm_serving.methods = with_thresholds
vllm_serving.main()
