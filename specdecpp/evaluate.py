"""`specdecpp evaluate`: candidate-length schedules against baselines on one pair (docs/design.md, Measuring)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import HfArgumentParser

from specdecpp.cli import input_errors, option
from specdecpp.engine.settings import DecodingSettings
from specdecpp.evaluation.hf_baselines import count_forwards, hf_assistant_settings, rounds_from_target_calls
from specdecpp.evaluation.methods import Counts, Method, MethodSpec, method_specs
from specdecpp.evaluation.report import report, run_title
from specdecpp.evaluation.runner import Evaluation, build_method, evaluate, measure, records_to_resume, run_cost
from specdecpp.evaluation.arguments import (BASELINES, ZOO_DIR, DecodingArguments, MethodGrid, Pair, Prompt,
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

    threads: int = option(0, "torch CPU threads (0: torch's default; small models run as fast, and steadier, on one)")


FLAGS = (HeadPairArguments, MethodGrid, DecodingArguments, PromptSource, RunOptions, EvaluateArguments)


def parse_args(argv: list[str] | None = None) -> tuple[HeadPairArguments, MethodGrid, DecodingArguments,
                                                        PromptSource, RunOptions, EvaluateArguments]:
    """The command's flags from `argv` (default: sys.argv), one value per dataclass of `FLAGS`."""
    parser = HfArgumentParser(FLAGS, description=(
        "Evaluate candidate-length schedules against baselines (default pair: the embedded one, checkpoints/zoo)."))
    return tuple(parser.parse_args_into_dataclasses(args=argv))


def main(argv: list[str] | None = None) -> None:
    """`specdecpp evaluate [flags]`; bad input exits non-zero with one line."""
    pair, grid, decoding, source, run, command = parse_args(argv)
    if command.threads:
        torch.set_num_threads(command.threads)
    torch.manual_seed(run.seed)
    with input_errors("evaluate"):
        document = evaluate(pair, grid, decoding.settings(), source, run)
    print(f"records: {document['records_file']}\nsummary: {Path(run.output) / 'summary.json'}")


if __name__ == "__main__":
    if not __package__:
        # run as a script: this folder would shadow top-level packages named like our modules
        del sys.path[0]
    main()
