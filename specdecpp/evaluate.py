"""Evaluate candidate-length schedules against baselines on one target/draft pair.

`python specdecpp/evaluate.py --target TARGET --draft DRAFT --head HEAD --schedule ada
--stop_threshold 0.3 --bound 2 20 --prompts humaneval --output OUT` (also `specdecpp evaluate ...`;
the reference's `--model_name`, `--assistant_name`, `--assist_acc_head_dir`, `--data_path`,
`--save_path` are accepted too; without a pair, the embedded one runs). Several schedules, K
values and thresholds run in one go (`--schedule constant ada dynamic --stop_threshold 0.1 0.3
0.5 0.7`), next to the baselines measured in the same run: the target alone, the draft alone,
and Hugging Face's own `generate(assistant_model=...)` with its constant, heuristic and dynamic
schedules.

Honest measurement (docs/design.md, Measuring): every method runs on every prompt, methods
interleaved per prompt (their order rotating) so that drift of the machine hits all alike; each
method is warmed up once before anything is timed; speedups are paired with the target-alone time of
the same prompt; the draft/target cost ratio c is timed after every prompt, so load hits it as it
hits the methods. Target calls, draft calls and discarded tokens are counted for every method — for
Hugging Face's by counting the models' forward passes. Greedy runs check, prompt by prompt, that
every speculative method's output equals the target's.

Output in `--output`: `results_{n_begin}to{n_end}.json` (one record per prompt and method,
the reference's fields plus ours), `summary.json` (the table below, the measured cost ratio,
the greedy verdict, the settings), `pareto.png` and `speedup_vs_threshold.png`.
Records are saved after every prompt, each save replacing the file atomically; `--resume` reruns
an interrupted run with the same flags, keeping the prompts it finished. A results file that
holds records is never replaced without `--resume` or `--overwrite`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import HfArgumentParser

from specdecpp.cli import input_errors
from specdecpp.engine.settings import DecodingSettings

# The names below are the evaluation's public ones (and those the tests use); they live in
# `specdecpp.evaluation`, split by job.
from specdecpp.evaluation.hf_baselines import count_forwards, hf_assistant_settings, rounds_from_target_calls
from specdecpp.evaluation.methods import Counts, Method, MethodSpec, method_specs
from specdecpp.evaluation.report import report, run_title
from specdecpp.evaluation.runner import Evaluation, build_method, evaluate, measure, records_to_resume, run_cost
from specdecpp.evaluation.settings import (BASELINES, ZOO_DIR, DecodingArguments, MethodGrid, Pair, Prompt,
                                           PromptSource, RunOptions, check_inputs, check_prompt_source, load_inputs,
                                           load_pair)
from specdecpp.models import HeadPairArguments

__all__ = ["BASELINES", "FLAGS", "ZOO_DIR", "Counts", "DecodingArguments", "DecodingSettings", "Evaluation",
           "EvaluateArguments", "HeadPairArguments", "Method", "MethodGrid", "MethodSpec", "Pair", "Prompt",
           "PromptSource", "RunOptions", "build_method", "check_inputs", "check_prompt_source", "count_forwards",
           "evaluate", "hf_assistant_settings", "load_inputs", "load_pair", "main", "measure", "method_specs",
           "parse_args", "records_to_resume", "report", "rounds_from_target_calls", "run_cost", "run_title"]

@dataclass
class EvaluateArguments:
    """What only the command sets: the process's torch threads."""

    threads: int = field(default=0, metadata={
        "help": "torch CPU threads (0: torch's default); small models run as fast on one, which also keeps "
                "other processes on a shared machine from slowing the run down"})


# The command's flags, in the order --help lists them: the pair first, then the evaluation's values.
FLAGS = (HeadPairArguments, MethodGrid, DecodingArguments, PromptSource, RunOptions, EvaluateArguments)


def parse_args(argv: list[str] | None = None) -> tuple[HeadPairArguments, MethodGrid, DecodingArguments,
                                                        PromptSource, RunOptions, EvaluateArguments]:
    """The command's flags from `argv` (default: sys.argv), one value per dataclass of `FLAGS`."""
    parser = HfArgumentParser(FLAGS, description=(
        "Evaluate candidate-length schedules against baselines (default pair: the embedded one, checkpoints/zoo)."))
    return tuple(parser.parse_args_into_dataclasses(args=argv))


def main(argv: list[str] | None = None) -> None:
    """`specdecpp evaluate [flags]`: set the process's threads and seed, run `evaluate`, and exit
    non-zero with a one-line message on bad input."""
    pair, grid, decoding, source, run, command = parse_args(argv)
    if command.threads:
        torch.set_num_threads(command.threads)
    torch.manual_seed(run.seed)
    with input_errors("evaluate"):
        document = evaluate(pair, grid, decoding.settings(), source, run)
    print(f"records: {document['records_file']}\nsummary: {Path(run.output) / 'summary.json'}")


if __name__ == "__main__":
    if not __package__:
        # run as `python specdecpp/evaluate.py`: Python put this folder first on sys.path, where
        # our modules would shadow top-level packages of the same names for what the run imports
        # from here on; the package itself comes from its install (`pip install -e .`)
        del sys.path[0]
    main()
