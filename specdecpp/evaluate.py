"""Evaluate candidate-length schedules against baselines on one target/draft pair.

`python specdecpp/evaluate.py --model_name TARGET --assistant_name DRAFT --schedule ada
--assist_acc_head_dir HEAD --stop_threshold 0.3 --bound 2 20 --data_path humaneval --save_path OUT`
(also `specdecpp evaluate ...`). Several schedules, K values and thresholds run in one go
(`--schedule constant ada dynamic --stop_threshold 0.1 0.3 0.5 0.7`), next to the baselines
measured in the same run: the target alone, the draft alone, and Hugging Face's own
`generate(assistant_model=...)` with its constant, heuristic and dynamic schedules.

Honest measurement (DESIGN section 4): every method runs on every prompt, methods interleaved
per prompt (their order rotating) so that drift of the machine hits all alike; each method is
warmed up once before anything is timed; speedups are paired with the target-alone time of the
same prompt; the draft/target cost ratio c is timed after every prompt, so load hits it as it
hits the methods. Target calls, draft calls and discarded tokens are counted for every method —
for Hugging Face's by counting the models' forward passes. Greedy runs check, prompt by prompt,
that every speculative method's output equals the target's.

Output in `--save_path`: `results_{n_begin}to{n_end}.json` (one record per prompt and method,
the reference's fields plus ours), `summary.json` (the table below, the measured cost ratio,
the greedy verdict, the settings), `pareto.png` and `speedup_vs_threshold.png`.
Records are saved after every prompt, each save replacing the file atomically; `--resume` reruns
an interrupted run with the same flags, keeping the prompts it finished. A results file that
holds records is never replaced without `--resume` or `--overwrite`.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # run as `python specdecpp/evaluate.py`: import our modules through the package, or their
    # folder on sys.path would shadow top-level packages of the same name
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from pathlib import Path

from transformers import HfArgumentParser

from specdecpp.cli import input_errors

# The names below are the evaluation's public ones (and those the tests use); they live in
# `specdecpp.evaluation`, split by job.
from specdecpp.evaluation.hf_baselines import count_forwards, hf_assistant_settings, rounds_from_target_calls
from specdecpp.evaluation.methods import Counts, Method, MethodSpec, method_specs
from specdecpp.evaluation.report import report, run_title
from specdecpp.evaluation.runner import Evaluation, build_method, evaluate, measure, records_to_resume, run_cost
from specdecpp.evaluation.settings import (BASELINES, ZOO_DIR, EvaluationArguments, ModelLoadingArguments, Pair,
                                           Prompt, check_arguments, check_prompt_source, load_inputs, load_pair)

__all__ = ["BASELINES", "ZOO_DIR", "Counts", "Evaluation", "EvaluationArguments", "Method", "MethodSpec",
           "ModelLoadingArguments", "Pair", "Prompt", "build_method", "check_arguments", "check_prompt_source",
           "count_forwards", "evaluate", "hf_assistant_settings", "load_inputs", "load_pair", "main", "measure",
           "method_specs", "parse_args", "records_to_resume", "report", "rounds_from_target_calls", "run_cost",
           "run_title"]


def parse_args(argv: list[str] | None = None) -> tuple[EvaluationArguments, ModelLoadingArguments]:
    """The command's flags (`EvaluationArguments` and `ModelLoadingArguments`) from `argv` (default: sys.argv)."""
    parser = HfArgumentParser((EvaluationArguments, ModelLoadingArguments),
                              description="Evaluate candidate-length schedules against baselines.")
    args, model_args = parser.parse_args_into_dataclasses(args=argv)
    return args, model_args


def main(argv: list[str] | None = None) -> None:
    """`specdecpp evaluate [flags]`: run `evaluate` and exit non-zero with a one-line message on bad input."""
    args, model_args = parse_args(argv)
    with input_errors("evaluate"):
        document = evaluate(args, model_args)
    print(f"records: {document['records_file']}\nsummary: {Path(args.save_path) / 'summary.json'}")


if __name__ == "__main__":
    main()
