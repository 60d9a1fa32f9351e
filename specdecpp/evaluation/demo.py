"""`specdecpp demo`: SpecDec++ against its baselines on HumanEval with the embedded pair, in one command."""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import torch
from transformers import HfArgumentParser
from transformers import logging as hf_logging

from specdecpp.cli import common_field, option
from specdecpp.costs import FLAT_COST
from specdecpp.engine.settings import DecodingSettings
from specdecpp.evaluation.methods import MethodSpec
from specdecpp.evaluation.runner import Evaluation
from specdecpp.evaluation.arguments import MethodGrid, Prompt, PromptSource, RunOptions
from specdecpp.measuring import metrics
from specdecpp.models import HeadPairArguments


@dataclass
class DemoArguments:
    """What the demo runs, beside the pair (by default the embedded one, in float32)."""

    prompts: str = common_field("prompts", aliases=("--data_path",), default="humaneval", help="prompt set or file")
    num_prompts: int = option(20, "prompts evaluated")
    tune_prompts: int = option(4, "prompts before those, used only to choose K (and the threshold)")
    max_new_tokens: int = option(128, "tokens generated per prompt at most")
    constant_ks: list[int] = option([2, 3, 4, 5], "K values to choose from")
    confidence_thresholds: list[float] = option([0.4, 0.3, 0.5], "our dynamic schedule's draft-confidence thresholds "
        "to choose from; Hugging Face's dynamic schedule starts from the first")
    stop_threshold: list[str] = option(["auto"], "ada thresholds to choose from ('auto': the one the head stores)")
    online_thresholds: list[float] = option([0.5], "the online schedule's thresholds to choose from")
    tree_nodes: int = option(16, "ada-tree's nodes per round")
    output: str = common_field("output", default="outputs/demo", help="folder for records, summary and figures")
    seed: int = common_field("seed", default=47, help="seeds each prompt's sampling")
    threads: int = option(1, "torch CPU threads (one is as fast for the embedded pair, and less slowed by other work)")
    progress: bool = option(True, "progress bars (--no_progress to hide)")
    compile: bool = option(False, "run our methods on the compiled engine (see specdecpp evaluate --compile)")


def evaluation(demo: DemoArguments, pair: HeadPairArguments) -> Evaluation:
    """The demo's greedy evaluation on `pair` over the demo's grid."""
    if demo.num_prompts < 1 or demo.tune_prompts < 0:
        raise ValueError(f"need --num_prompts >= 1 and --tune_prompts >= 0, got {demo.num_prompts} and "
                         f"{demo.tune_prompts}")
    if demo.tune_prompts == 0 and max(len(demo.constant_ks), len(demo.confidence_thresholds),
                                      len(demo.stop_threshold), len(demo.online_thresholds)) > 1:
        raise ValueError("choosing among several --constant_ks, --confidence_thresholds, --stop_threshold or "
                         "--online_thresholds values needs --tune_prompts >= 1")
    # The token tree beside the chains at a fixed size: `auto` would need step times stored with the head.
    grid = MethodGrid(schedule=["constant", "dynamic", "online", "ada", "ada-tree"], num_assistant_tokens=demo.constant_ks,
                      assistant_confidence_threshold=demo.confidence_thresholds, stop_threshold=demo.stop_threshold,
                      online_threshold=demo.online_thresholds, tree_nodes=[str(demo.tree_nodes)],
                      baselines=["target", "hf:dynamic"])
    source = PromptSource(prompts=demo.prompts, n_end=demo.tune_prompts + demo.num_prompts)
    run = RunOptions(output=demo.output, seed=demo.seed, progress=demo.progress)
    pair.single_head()
    return Evaluation(pair, grid, DecodingSettings(max_new_tokens=demo.max_new_tokens, compile=demo.compile), source,
                      run)


def choose(run: Evaluation, prompts: list[Prompt]) -> tuple[dict[str, MethodSpec], list[dict], dict | None]:
    """Each of our schedules' cheapest spec on `prompts`: `(choices, tuning summary, its cost or None)`."""
    specs = run.specs
    candidates = [s for s in specs if s.engine == "specdecpp"]
    schedules = {s.schedule for s in candidates}
    if len(candidates) == len(schedules):
        return {s.schedule: s for s in candidates}, [], None
    by_name = {s.name: s for s in specs}
    records, cost = run.measure([by_name["target"]] + candidates, prompts, label="choose K")
    summary = metrics.summarize(records, cost["cost_ratio"])
    best = {schedule: by_name[min((row for row in summary if row["schedule"] == schedule),
                                  key=lambda row: row["cost_per_token"])["method"]]
            for schedule in schedules}
    return best, summary, cost


def run_demo(demo: DemoArguments, pair: HeadPairArguments | None = None) -> dict:
    """Choose the knobs on the tuning prompts, evaluate on the others; returns the summary document."""
    run = evaluation(demo, pair or HeadPairArguments())
    prompts = run.prompts
    if len(prompts) <= demo.tune_prompts:
        raise ValueError(f"{demo.prompts} has only {len(prompts)} prompts; "
                         f"need more than --tune_prompts {demo.tune_prompts}")
    tuning, evaluated = prompts[:demo.tune_prompts], prompts[demo.tune_prompts:]
    best, tuning_summary, tuning_cost = choose(run, tuning)
    by_name = {spec.name: spec for spec in run.specs}
    final = [by_name["target"], by_name["hf:dynamic"], best["constant"], best["dynamic"], best["online"], best["ada"],
             *([best["ada-tree"]] if "ada-tree" in best else [])]
    records, cost = run.measure(final, evaluated, save=True)
    how = how_chosen(best, tuning, evaluated, demo, tuning_cost)
    print(how)
    document = run.report(records, cost, evaluated, chosen=how, tuning_summary=tuning_summary)
    print(headline(document["summary"]))
    return document


def how_chosen(best: dict[str, MethodSpec], tuning: list[Prompt], evaluated: list[Prompt], demo: DemoArguments,
               tuning_cost: dict | None) -> str:
    picked = (f"constant K = {best['constant'].num_assistant_tokens}, dynamic confidence = "
              f"{best['dynamic'].assistant_confidence_threshold:g}, online threshold = "
              f"{best['online'].stop_threshold:g}, ada threshold = {best['ada'].name.split('@')[-1]}"
              + (f", ada-tree {best['ada-tree'].name.split('@')[-1]}" if "ada-tree" in best else ""))
    if not tuning or tuning_cost is None:
        return f"{picked} (given)."
    return (f"{picked} (of K {demo.constant_ks}, confidences {demo.confidence_thresholds}, online thresholds "
            f"{demo.online_thresholds} and ada thresholds {demo.stop_threshold}) were chosen by the lowest {FLAT_COST}, "
            f"(target calls + c * draft calls) / token, on {len(tuning)} tuning prompts "
            f"({demo.prompts} {tuning[0].id}-{tuning[-1].id}; c = {tuning_cost['cost_ratio']:.3f} measured there) "
            f"that are not among the {len(evaluated)} evaluated ({evaluated[0].id}-{evaluated[-1].id}).")


def headline(summary: list[dict]) -> str:
    """SpecDec++ against the other methods: flat cost per token, then the measured speedup."""
    rows = {row["schedule"] if row["engine"] == "specdecpp" else row["method"]: row for row in summary}
    ada, constant, dynamic, online, hf = (rows[name] for name in ("ada", "constant", "dynamic", "online", "hf:dynamic"))

    def change(row: dict) -> str:
        return f"{100 * (ada['cost_per_token'] / row['cost_per_token'] - 1):+.1f}%"

    tree = rows.get("ada-tree")
    tree_line = (f" The head's token tree ({tree['method']}): {FLAT_COST} {tree['cost_per_token']:.3f}, "
                 f"the chain {change(tree)} against it; speedup {tree['speedup']:.2f}x.") if tree else ""
    return (f"SpecDec++ ({ada['method']}): {FLAT_COST} {ada['cost_per_token']:.3f}, {change(constant)} against the "
            f"best constant K ({constant['cost_per_token']:.3f}), {change(dynamic)} against our dynamic at its best "
            f"confidence ({dynamic['cost_per_token']:.3f}), {change(online)} against vLLM's online estimator "
            f"({online['method']}, {online['cost_per_token']:.3f}), Hugging Face dynamic {hf['cost_per_token']:.3f}; "
            f"speedup over the target alone {ada['speedup']:.2f}x against {constant['speedup']:.2f}x, "
            f"{dynamic['speedup']:.2f}x, {online['speedup']:.2f}x and {hf['speedup']:.2f}x (medians over prompts of "
            "paired times, this run)." + tree_line)


FLAGS = (HeadPairArguments, DemoArguments)  # the command's flags, in --help's order


def main(argv: list[str] | None = None) -> None:
    """`specdecpp demo [flags]`; bad input exits with one line."""
    pair, demo = HfArgumentParser(FLAGS, description=__doc__.splitlines()[0]).parse_args_into_dataclasses(args=argv)
    pair = replace(pair, torch_dtype=pair.torch_dtype or "float32")
    if demo.threads:
        torch.set_num_threads(demo.threads)
    torch.manual_seed(demo.seed)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        run_demo(demo, pair)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"specdecpp demo: error: {error}")


if __name__ == "__main__":
    main()
