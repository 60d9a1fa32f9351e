"""Evaluation of candidate-length schedules against baselines, split by job.

`settings` (the flags, the checks that need no model, prompts and pair loading) is the bottom;
`methods` (method specs and our engine's adapter) and `hf_baselines` (Hugging Face's assisted
generation, counted from the outside) build on it; `report` (summary, tables, figures) and
`runner` (the measurement loop with resume, `Evaluation`, `evaluate`) sit on top. Nothing here
imports upward; `specdecpp/evaluate.py` is the command.
"""
from specdecpp.evaluation.methods import Counts, Method, MethodSpec, method_specs
from specdecpp.evaluation.report import report, run_title
from specdecpp.evaluation.runner import Evaluation, evaluate, measure, records_to_resume, run_cost
from specdecpp.evaluation.settings import (ZOO_DIR, EvaluationArguments, ModelLoadingArguments, Pair, Prompt,
                                           check_arguments, load_pair)

__all__ = ["Counts", "Evaluation", "EvaluationArguments", "Method", "MethodSpec", "ModelLoadingArguments", "Pair",
           "Prompt", "ZOO_DIR", "check_arguments", "evaluate", "load_pair", "measure", "method_specs",
           "records_to_resume", "report", "run_cost", "run_title"]
