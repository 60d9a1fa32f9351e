"""Evaluation of candidate-length schedules against baselines, split by job.

`settings` (what is compared, how it decodes, on which prompts, how the run goes; the checks
that need no model; prompts and pair loading) is the bottom; `methods` (method specs and our
engine's adapter) and `hf_baselines` (Hugging Face's assisted generation, counted from the
outside) build on it; `report` (summary, tables, figures) and `runner` (the measurement loop with
resume, `Evaluation`, `evaluate`) sit on top, `plots` drawing the report's figures. Nothing
here imports upward; the one command here is `demo` (`specdecpp demo`, over the runner), and
`specdecpp/evaluate.py` is the evaluate command.
"""
from specdecpp.evaluation.methods import Counts, Method, MethodSpec, method_specs
from specdecpp.evaluation.report import report, run_title
from specdecpp.evaluation.runner import Evaluation, evaluate, measure, records_to_resume, run_cost
from specdecpp.evaluation.settings import (ZOO_DIR, DecodingArguments, MethodGrid, Pair, Prompt, PromptSource,
                                           RunOptions, check_inputs, load_pair, zoo_pair)
from specdecpp.models import HeadPairArguments

__all__ = ["Counts", "DecodingArguments", "Evaluation", "HeadPairArguments", "Method", "MethodGrid", "MethodSpec",
           "Pair", "Prompt", "PromptSource", "RunOptions", "ZOO_DIR", "check_inputs", "evaluate", "load_pair",
           "measure", "method_specs", "records_to_resume", "report", "run_cost", "run_title", "zoo_pair"]
