"""The measurement loop: every method on every prompt, interleaved, timed, saved after each prompt (resumable)."""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from specdecpp.data.io import write_json
from specdecpp.engine.compiled import longest_per_capacity
from specdecpp.engine.schedules import SCHEDULES
from specdecpp.engine.settings import DecodingSettings
from specdecpp.evaluation.hf_baselines import hf_assisted_generate
from specdecpp.evaluation.methods import Method, MethodSpec, engine_generate, method_specs
from specdecpp.evaluation.report import report, run_title
from specdecpp.evaluation.arguments import (MethodGrid, Pair, Prompt, PromptSource, RunOptions,
                                           check_results_replaceable, load_inputs, load_pair, results_file, zoo_pair)
from specdecpp import costs
from specdecpp.measuring import step_timing
from specdecpp.models import HeadPairArguments


def build_method(spec: MethodSpec, pair: Pair, decoding: DecodingSettings) -> Method:
    """A runnable method for `spec` on `pair` under `decoding`, an `auto` threshold resolved."""
    if spec.engine == "hf":
        return Method(spec, hf_assisted_generate(spec, pair, decoding))
    if spec.engine is None:
        model = pair.target if spec.name == "target" else pair.draft
        return Method(spec, *engine_generate(spec, model, None, None, decoding))
    head = pair.heads.get(spec.head)
    if head is not None and spec.stop_threshold is not None:  # ada's (ada-budget has none)
        times = step_timing.auto_step_times(head, pair.target, pair.draft, decoding.compile) \
            if spec.stop_threshold == "auto" else None
        spec = replace(spec, stop_threshold=head.resolve_stop_threshold(spec.stop_threshold, times))
    return Method(spec, *engine_generate(spec, pair.target, pair.draft, head, decoding))


def warm_up(methods: list[Method], prompts: list[Prompt], tokens: int, seed: int, compile: bool = False) -> float:
    """Run each method once untimed (compiled: per capacity's longest prompt), then restart it; the compile seconds."""
    seconds = 0.0
    if compile:
        seconds = sum(method.generate(prompt, seed).compile_time for prompt in longest_per_capacity(
            prompts, lambda prompt: len(prompt.ids) + prompt.max_new_tokens) for method in methods)
    elif tokens > 0:
        short = Prompt(prompts[0].id, prompts[0].text, prompts[0].ids, min(tokens, prompts[0].max_new_tokens))
        for method in methods:
            method.generate(short, seed)
    for method in methods:
        method.restart()
    return seconds


def run_evaluation(methods: list[Method], prompts: list[Prompt], run: RunOptions, probe: step_timing.CostProbe,
                   tokenizer=None, on_prompt: Callable[[list[dict]], None] | None = None, label: str = "evaluate",
                   target: PreTrainedModel | None = None, greedy: bool = True) -> list[dict]:
    """One record per (prompt, method), methods in rotating order, prompt i seeded `run.seed + i`, then cost steps."""
    records: list[dict] = []
    for n, prompt in enumerate(tqdm(prompts, desc=label, unit="prompt", disable=not run.progress)):
        seed = run.seed + prompt.id
        order = methods[n % len(methods):] + methods[:n % len(methods)]
        runs = {}
        for method in order:
            start = time.perf_counter()
            runs[method.spec.name] = (method.generate(prompt, seed), time.perf_counter() - start)
        draft_ms, target_ms = probe.sample(run.cost_steps_per_prompt)
        timing = {"draft_step_ms": statistics.median(draft_ms), "target_verify_ms": statistics.median(target_ms)}
        for method in methods:
            record = _record(prompt, method.spec, runs, greedy, tokenizer)
            differs = record["matches_target"] is False and target is not None
            margin = first_difference_margin(target, prompt.ids, runs[method.spec.name][0].tokens,
                                             runs["target"][0].tokens) if differs else None
            records.append({**record, **timing, "first_difference_margin": margin})
        if on_prompt is not None:
            on_prompt(records)
    return records


def first_difference_margin(target: PreTrainedModel, prompt: list[int], tokens: list[int],
                            reference: list[int]) -> float:
    """The target's top-two logit gap where greedy `tokens` first differ from its own `reference`."""
    common = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
    device = target.get_input_embeddings().weight.device
    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([prompt + reference[:common]], device=device)).logits[0, -1]
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def _record(prompt: Prompt, spec: MethodSpec, runs: dict, greedy: bool, tokenizer) -> dict:
    """The reference's per-prompt fields for one method (`spec_time`, `num_LM_call`, ...) plus ours."""
    counts, seconds = runs[spec.name]
    target, target_time = runs["target"]
    draft, draft_time = runs.get("draft", (None, None))
    checked = spec.engine is not None and greedy
    return {
        "id": prompt.id, "method": spec.name, "engine": spec.engine, "schedule": spec.schedule,
        "num_assistant_tokens": spec.num_assistant_tokens, "stop_threshold": spec.stop_threshold,
        "head": spec.head, "assistant_confidence_threshold": spec.assistant_confidence_threshold,
        "prompt": prompt.text, "prefix": prompt.ids,
        "spec_time": seconds, "target_time": target_time, "draft_time": draft_time,
        "num_mismatched_tokens": counts.discarded_tokens, "num_LM_call": counts.target_calls,
        "generated_length": len(counts.tokens), "generated_length_target": len(target.tokens),
        "generated_length_draft": len(draft.tokens) if draft is not None else None,
        "draft_calls": counts.draft_calls, "accepted_lengths": counts.accepted_lengths,
        "speedup": target_time / seconds, "tokens": counts.tokens,
        "output": tokenizer.decode(counts.tokens) if tokenizer is not None else None,
        "matches_target": counts.tokens == target.tokens if checked else None,
        "compile_time": counts.compile_time,
    }


def measure(pair: Pair, specs: list[MethodSpec], prompts: list[Prompt], decoding: DecodingSettings, run: RunOptions,
            results_path: Path | None = None, label: str = "evaluate",
            done: list[dict] | None = None) -> tuple[list[dict], dict]:
    """Warm up, then run every prompt not in `done`, saved to `results_path` after each: the records and run cost."""
    done = done or []
    methods = [build_method(spec, pair, decoding) for spec in specs]
    compile_seconds = warm_up(methods, prompts, run.warmup_tokens, run.seed, decoding.compile)
    probe = step_timing.CostProbe(pair.target, pair.draft, torch.tensor([prompts[0].ids]), compile=decoding.compile)
    finished = {record["id"] for record in done}
    todo = [prompt for prompt in prompts if prompt.id not in finished]
    if results_path is not None:
        results_path.parent.mkdir(parents=True, exist_ok=True)
    save = (lambda so_far: write_json(results_path, done + so_far)) if results_path is not None else None
    records = done + run_evaluation(methods, todo, run, probe, pair.tokenizer, on_prompt=save, label=label,
                                    target=pair.target, greedy=not decoding.do_sample)
    return records, {**run_cost(records, probe, run.cost_steps_per_prompt), "compile_seconds": compile_seconds}


def run_cost(records: list[dict], probe: step_timing.CostProbe, steps_per_prompt: int) -> dict:
    """The run's cost ratio `c`: medians over prompts of the draft step and verification timed after each."""
    timed = {r["id"]: (r["draft_step_ms"], r["target_verify_ms"]) for r in records}
    draft_ms, target_ms = (list(times) for times in zip(*timed.values()))
    return {**costs.cost_ratio(draft_ms, target_ms, probe.k), "steps_per_prompt": steps_per_prompt,
            "prompts": len(timed)}


def records_to_resume(path: Path, specs: list[MethodSpec], prompts: list[Prompt]) -> list[dict]:
    """The records an interrupted run saved at `path`, checked to be of the same methods and prompts."""
    if not path.is_file():
        return []
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # not JSON, or not text
        raise ValueError(damaged(path, str(error))) from None
    if not isinstance(records, list) or not all(isinstance(r, dict) and {"id", "method", "prefix"} <= r.keys()
                                                for r in records):
        raise ValueError(damaged(path, "not a list of records"))
    names = sorted(spec.name for spec in specs)
    by_id = {prompt.id: prompt for prompt in prompts}
    saved_by_id: dict[int, list[dict]] = {}
    for record in records:
        saved_by_id.setdefault(record["id"], []).append(record)
    for prompt_id, saved in saved_by_id.items():
        if sorted(record["method"] for record in saved) != names:
            raise ValueError(f"{path} holds other methods than this run ({', '.join(names)}); "
                             "rerun with the same flags, or choose another --output to start afresh")
        if prompt_id not in by_id or saved[0]["prefix"] != by_id[prompt_id].ids:
            raise ValueError(f"{path} holds other prompts than this run (prompt {prompt_id} differs); "
                             "rerun with the same flags, or choose another --output to start afresh")
    return records


def damaged(path: Path, why: str) -> str:
    return f"results file {path} is damaged ({why}): rerun with --overwrite to start again, or restore it"


class Evaluation:
    """One evaluation, its inputs checked and prompts read before any model loads; the pair loads on first use."""

    def __init__(self, pair: HeadPairArguments, grid: MethodGrid | None = None,
                 decoding: DecodingSettings | None = None, source: PromptSource | None = None,
                 run: RunOptions | None = None):
        self.pair_arguments = zoo_pair(pair)
        self.grid, self.decoding = grid or MethodGrid(), decoding or DecodingSettings()
        self.source, self.run = source or PromptSource(), run or RunOptions()
        self.tokenizer, self.prompts = load_inputs(self.pair_arguments, self.grid, self.decoding, self.source, self.run)
        self.specs = method_specs(self.grid, self.pair_arguments.head)
        self._pair: Pair | None = None

    @property
    def pair(self) -> Pair:
        """The loaded target, draft, heads (when a method needs one) and tokenizer."""
        if self._pair is None:
            need_head = any(SCHEDULES[spec.schedule].needs_head for spec in self.specs)
            self._pair = load_pair(self.pair_arguments, self.tokenizer, need_head)
        return self._pair

    def measure(self, specs: list[MethodSpec] | None = None, prompts: list[Prompt] | None = None,
                save: bool = False, label: str = "evaluate",
                done: list[dict] | None = None) -> tuple[list[dict], dict]:
        """`measure` the `specs` (default: the grid) on the `prompts` (default: all)."""
        specs = self.specs if specs is None else specs
        prompts = self.prompts if prompts is None else prompts
        path = results_file(self.run.output, prompts) if save else None
        return measure(self.pair, specs, prompts, self.decoding, self.run, results_path=path, label=label, done=done)

    def report(self, records: list[dict], cost: dict, prompts: list[Prompt] | None = None, title: str = "",
               **extra) -> dict:
        """`report` the records measured on `prompts`, with `extra` entries in the summary."""
        prompts = self.prompts if prompts is None else prompts
        path = results_file(self.run.output, prompts)
        return report(records, cost, self.run.output, title or run_title(self.source.prompts, prompts, self.decoding),
                      figures=self.run.plots, settings=self.settings(), **extra, records_file=str(path))

    def settings(self) -> dict:
        """Every setting of the run by its flag's name, as `summary.json` records them."""
        decoding = {name: getattr(self.decoding, name)
                    for name in ("bound", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p",
                                "repetition_penalty", "compile")}
        return {**asdict(self.pair_arguments), **asdict(self.grid), **decoding, **asdict(self.source),
                **asdict(self.run)}


def evaluate(pair: HeadPairArguments, grid: MethodGrid | None = None, decoding: DecodingSettings | None = None,
             source: PromptSource | None = None, run: RunOptions | None = None, title: str = "") -> dict:
    """Check, resume or refuse to replace saved records, measure and report; returns the summary document."""
    evaluation = Evaluation(pair, grid, decoding, source, run)
    path = results_file(evaluation.run.output, evaluation.prompts)
    if evaluation.run.resume:
        done = records_to_resume(path, evaluation.specs, evaluation.prompts)
    else:
        check_results_replaceable(path, evaluation.run.overwrite)
        done = []
    records, cost = evaluation.measure(save=True, done=done)
    return evaluation.report(records, cost, title=title)
