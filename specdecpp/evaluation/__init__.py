"""Evaluation of candidate-length schedules against baselines, and the demo."""
from specdecpp.evaluation.methods import Counts, Method, MethodSpec, method_specs
from specdecpp.evaluation.report import report, run_title
from specdecpp.evaluation.runner import Evaluation, evaluate, measure, records_to_resume, run_cost
from specdecpp.evaluation.arguments import (ZOO_DIR, DecodingArguments, MethodGrid, Pair, Prompt, PromptSource,
                                           RunOptions, check_inputs, load_pair, zoo_pair)
from specdecpp.models import HeadPairArguments

__all__ = ["Counts", "DecodingArguments", "Evaluation", "HeadPairArguments", "Method", "MethodGrid", "MethodSpec",
           "Pair", "Prompt", "PromptSource", "RunOptions", "ZOO_DIR", "check_inputs", "evaluate", "load_pair",
           "measure", "method_specs", "records_to_resume", "report", "run_cost", "run_title", "zoo_pair"]
