"""Where does decoding time go? Measured time per token beside the time each method's own counts
predict, for every schedule on one prompt set.

The step times come from `specdecpp.measuring.step_timing.StepProbe` (the loop's own steps, timed in rounds as
the loop takes them, without and with the head's judgement) on the context a generation sees
halfway: the prompt nearest the mean length and the first half of the target's continuation; compiled, one
such context per engine capacity the prompts take, each generation priced at its own capacity's times. Then every method decodes every prompt,
methods interleaved prompt by prompt (the first one rotating), the first prompt a warm-up. For each method it prints:
measured ms/token (total time over total tokens), predicted ms/token (each round priced at its
length, each judgement, the round overhead, and each prompt's prefill timed on its own), their
ratio, and the counts behind the prediction. Greedy, no EOS (every method generates the same
number of tokens), one torch thread unless `--threads`. `--engine eager compiled` runs every method
on both engines, interleaved, and adds each compiled method's gain over its eager self; graphs are
compiled before anything is timed. Last, per engine, `ada`'s tokens/s over the fastest `dynamic`'s, with the
interval 90% of resamples of the prompts give: how much the prompt set alone moves it.

    python benchmarks/time_breakdown.py                                  # zoo pair, stdlib-heldout 0-12
    python benchmarks/time_breakdown.py --engine eager compiled          # the compiled engine beside the eager one
    python benchmarks/time_breakdown.py --data_path humaneval --n_end 20 --max_new_tokens 128
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from harness import DRAFT, HEAD, TARGET, load_pair, load_prompt_ids, per_token, rotated, summed, warm_up

from transformers import PreTrainedModel

from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.costs import StepTimes, loop_overhead_ms
from specdecpp.engine.compiled import capacity_for
from specdecpp.engine.decoding import GenerationStats, step_models
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.settings import DecodingSettings, default
from specdecpp.measuring.step_timing import StepProbe, auto_step_times, measure_round_overhead


def methods(head: AcceptancePredictionHead, bound: tuple[int, int], thresholds: list[str],
            confidences: tuple[float, ...] = (0.3, 0.4, 0.5)) -> dict[str, dict]:
    """The schedules compared: target alone, constant K, our `dynamic` at `confidences`, `ada`
    at `thresholds` (`auto`: the head's, chosen for the engine it runs on), and the oracle."""
    table = {"target alone": dict(schedule="none")}
    table.update({f"constant K={k}": dict(schedule="constant", num_assistant_tokens=k) for k in (2, 3, 4)})
    table.update({f"dynamic@{c:g}": dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=c)
                  for c in confidences})
    for threshold in thresholds:
        threshold = threshold if threshold == "auto" else float(threshold)
        table[f"ada@{threshold}"] = dict(schedule="ada", head=head, stop_threshold=threshold, bound=bound)
    table["oracle"] = dict(schedule="oracle", bound=bound)
    return table


def breakdown(target, draft, head: AcceptancePredictionHead, prompts: list[torch.Tensor], table: dict[str, dict],
              engines: list[str], max_new_tokens: int, bound: tuple[int, int],
              reference: Callable[[torch.Tensor, int], torch.Tensor] | None = None, probe_length: int | None = None
              ) -> dict:
    """Every method of `table` on every engine of `engines` over `prompts` (see the module
    docstring; `reference(prompt, max_new_tokens)`, when given, runs in the same rotation as one
    more method, named "reference"; steps are timed in rounds of up to `probe_length` tokens, by
    default `bound`'s longest, longer rounds priced at the last). Returns the rows, the step times, the compile seconds, each
    engine's context length and each method's output sequences per prompt (the warm-up prompt's included)."""
    compiled = {engine: engine == "compiled" for engine in engines}

    def capacity_of(engine: str, prompt: torch.Tensor) -> int | None:
        """The cache capacity of `prompt`'s compiled engines (None: the eager engine's cache grows)."""
        return capacity_for(prompt.shape[1] + max_new_tokens) if compiled[engine] else None

    groups = {}  # (engine, capacity) -> the timed prompts generated on it
    for engine in engines:
        for prompt in prompts[1:] or prompts:
            groups.setdefault((engine, capacity_of(engine, prompt)), []).append(prompt)
    contexts = {group: typical_context(target, of_group, max_new_tokens) for group, of_group in groups.items()}
    main = {engine: max((group for group in groups if group[0] == engine), key=lambda group: len(groups[group]))
            for engine in engines}
    grid = [(engine, name) for name in table for engine in engines]
    outputs = {method: [] for method in grid}
    # `auto` chooses with the step times of the engine it runs on, as the evaluation and `generate` do.
    auto_times = {engine: auto_step_times(head, target, draft, compiled[engine]) for engine in engines} \
        if any(settings.get("stop_threshold") == "auto" for settings in table.values()) else {}

    def run(method: tuple[str, str], prompt: torch.Tensor, max_new_tokens: int) -> GenerationStats:
        engine, name = method
        settings = table[name]
        if settings.get("stop_threshold") == "auto":
            settings = {**settings, "step_times": auto_times[engine]}
        out = speculative_generate(target, None if settings["schedule"] == "none" else draft, prompt,
                                   max_new_tokens=max_new_tokens, eos_token_id=[], compile=compiled[engine],
                                   **settings)
        outputs[method].append(out.sequences)
        return out.stats

    # Compiled graphs (and caches that hold the longest prompt) are built before anything is timed.
    compile_seconds = warm_up(run, [m for m in grid if compiled[m[0]]], prompts, max_new_tokens, compile=True) \
        if "compiled" in engines else 0.0
    for method in outputs:
        outputs[method].clear()
    probes = {(group, kind): StepProbe(target, draft, contexts[group], probe_length or bound[1],
                                       head=head if kind == "ada" else None, compile=compiled[group[0]],
                                       max_length=group[1])
              for group in groups for kind in ("plain", "ada")}
    runs, overheads, reference_ms = [], {engine: [] for engine in engines}, [0.0, 0]
    timed_from = math.inf  # when the first timed prompt began (`time.perf_counter`); `timed_until`: the last ended
    for i, prompt in enumerate(prompts):
        if i == 1:
            timed_from = time.perf_counter()
        for method in rotated(grid + ([("reference", None)] if reference else []), i):
            if method[0] == "reference":
                start = time.perf_counter()
                outputs.setdefault(method, []).append(reference(prompt, max_new_tokens))
                if i > 0:
                    reference_ms[0] += 1000 * (time.perf_counter() - start)
                    reference_ms[1] += outputs[method][-1].shape[1] - prompt.shape[1]
                continue
            stats = run(method, prompt, max_new_tokens)
            if i > 0:  # the first prompt is a warm-up
                runs.append((*method, prompt, stats))
        # Step times sampled between prompts, so that machine load hits them as it hits the methods.
        for probe in probes.values():
            probe.sample()
        for engine in engines:
            overheads[engine].append(measure_round_overhead(target, draft, contexts[main[engine]], runs=1,
                                                            compile=compiled[engine]))
    timed_until = time.perf_counter()
    times = {}  # (engine, capacity) -> (plain, judged) step times
    for group in groups:
        plain = replace(probes[group, "plain"].times(), round_overhead_ms=statistics.median(overheads[group[0]]))
        times[group] = plain, replace(probes[group, "ada"].times(), round_overhead_ms=plain.round_overhead_ms)

    # Counts and wall times pooled per method (`harness.summed`), beside what the step times predict.
    measured = {method: [] for method in grid}
    predicted, judged, own_ms = dict.fromkeys(grid, 0.0), dict.fromkeys(grid, 0), dict.fromkeys(grid, 0.0)
    predicted_parts = {method: [0.0, 0.0] for method in grid}  # (drafting, verifying), prefill included
    prefills = {}
    for engine, name, prompt, stats in runs:
        alone, is_ada = table[name]["schedule"] == "none", table[name]["schedule"] == "ada"
        plain, judged_times = times[engine, capacity_of(engine, prompt)]
        key = (engine, id(prompt), alone)
        if key not in prefills:
            prefills[key] = prefill_extra_ms(target, None if alone else draft, prompt, plain, compile=compiled[engine],
                                             max_length=prompt.shape[1] + max_new_tokens)
        step_times = judged_times if is_ada else plain
        count = judged_tokens(stats.draft_lengths, head.alignment if is_ada else None)
        predicted[engine, name] += predicted_ms(step_times, stats.draft_lengths, count, with_draft=not alone) \
            + sum(prefills[key])
        parts = predicted_parts[engine, name]
        parts[0] += sum(step_times.round_ms(k, 0, 0) - step_times.round_ms(0) for k in stats.draft_lengths) \
            + prefills[key][1]
        parts[1] += (len(stats.draft_lengths) * step_times.target_alone_ms if alone else
                     sum(step_times.verify_ms[min(k, len(step_times.verify_ms) - 1)] for k in stats.draft_lengths)) \
            + prefills[key][0]
        judged[engine, name] += count
        own_ms[engine, name] += loop_overhead_ms(stats) * stats.target_calls
        measured[engine, name].append(stats)
    totals = {method: summed(runs_of) for method, runs_of in measured.items()}
    rows = []
    for engine, name in sorted(grid, key=lambda method: engines.index(method[0])):
        total = totals[engine, name]
        tokens, ms_per_token = total["generated_length"], 1000 * per_token(total, "wall_time")
        row = {"engine": engine, "method": name, "stop_threshold": measured[engine, name][0].stop_threshold,
               "measured_ms_per_token": ms_per_token,
               "predicted_ms_per_token": predicted[engine, name] / tokens,
               "target_calls_per_token": per_token(total, "target_calls"),
               "draft_calls_per_token": per_token(total, "draft_calls"), "judged_per_token": judged[engine, name] / tokens,
               "stop_decision_ms_per_draft_step": 1000 * total["schedule_time"] / total["draft_calls"]
               if total["draft_calls"] else None,
               "loop_ms_per_round": own_ms[engine, name] / total["target_calls"],
               "draft_ms_per_token": 1000 * per_token(total, "draft_time"),
               "predicted_draft_ms_per_token": predicted_parts[engine, name][0] / tokens,
               "verify_ms_per_token": 1000 * per_token(total, "verify_time"),
               "predicted_verify_ms_per_token": predicted_parts[engine, name][1] / tokens,
               "wall_ms_by_prompt": [1000 * stats.wall_time for stats in measured[engine, name]],
               # draft length -> rounds, so that a run can be priced again offline
               "rounds_by_draft_length": dict(sorted(Counter(k for stats in measured[engine, name]
                                                             for k in stats.draft_lengths).items()))}
        row["ratio"] = row["measured_ms_per_token"] / row["predicted_ms_per_token"]
        row["speedup"] = 1000 * per_token(totals[engine, "target alone"], "wall_time") / ms_per_token
        if reference:
            row["speedup_over_reference"] = reference_ms[0] / reference_ms[1] / ms_per_token
        eager = totals.get(("eager", name))
        row["eager_over_this"] = 1000 * per_token(eager, "wall_time") / ms_per_token if eager else None
        rows.append(row)
    others = {engine: {str(group[1]): {"prompts": len(groups[group]), "context_tokens": contexts[group].shape[1],
                                       "plain": times[group][0].as_dict(), "judged": times[group][1].as_dict()}
                       for group in groups if group[0] == engine and group != main[engine]} for engine in engines}
    return {"rows": rows, "step_times": {engine: times[main[engine]][0].as_dict() for engine in engines},
            "judged_step_times": {engine: times[main[engine]][1].as_dict() for engine in engines},
            "capacity": {engine: main[engine][1] for engine in engines},
            "step_times_at_other_capacities": {engine: other for engine, other in others.items() if other},
            "compile_seconds": compile_seconds,
            "context_tokens": {engine: contexts[main[engine]].shape[1] for engine in engines}, "outputs": outputs,
            "timed_from": timed_from, "timed_until": timed_until,
            "reference_ms_per_token": reference_ms[0] / reference_ms[1] if reference else None}


def predicted_ms(times: StepTimes, draft_lengths: list[int], judged: int = 0, with_draft: bool = True) -> float:
    """The time `times` price rounds of `draft_lengths` and `judged` judgements at, prefill left out
    (`with_draft=False`: as many target-alone steps)."""
    if not with_draft:
        return len(draft_lengths) * times.target_alone_ms
    return sum(times.round_ms(k) for k in draft_lengths) + judged * times.judge_ms


def judged_tokens(draft_lengths: list[int], alignment: str | None) -> int:
    """How many drafted tokens the head (`alignment`; None: no head) judges over rounds of `draft_lengths`."""
    if alignment == "proposer":
        return sum(draft_lengths)
    if alignment == "reader":
        return sum(max(k - 1, 0) for k in draft_lengths)
    return 0


def prefill_extra_ms(target: PreTrainedModel, draft: PreTrainedModel | None, input_ids: torch.LongTensor,
                     times: StepTimes, compile: bool = False, max_length: int | None = None) -> tuple[float, float]:
    """What reading the prompt adds (ms) to a generation's first verification and to its first draft step
    (`draft=None`: to the target alone's first step, and 0), on the engines of generations of `max_length` tokens."""
    first_target_step = times.target_alone_ms if draft is None else times.verify_ms[0]
    to_draft = prefill_ms(draft, input_ids, compile, max_length) - times.draft_ms[0] \
        if draft is not None and times.draft_ms else 0.0
    return prefill_ms(target, input_ids, compile, max_length) - first_target_step, to_draft


def prefill_ms(model: PreTrainedModel, input_ids: torch.LongTensor, compile: bool, max_length: int | None) -> float:
    """One forward of `model` over the prompt `input_ids` on the engine of generations of `max_length` tokens (ms)."""
    seq = input_ids[0].tolist()
    cached, _, _ = step_models(model, None, DecodingSettings(compile=compile, bound=default("bound")), sampling_only(False),
                               max(max_length or 0, len(seq)))
    with torch.inference_mode():
        start = time.perf_counter()
        cached.logits(seq, num_logits=1)
        return 1000 * (time.perf_counter() - start)


def typical_context(target, prompts: list[torch.Tensor], max_new_tokens: int) -> torch.Tensor:
    """The context a generation of `prompts` sees halfway: the prompt nearest their mean length and the first half
    of the target's continuation."""
    mean_length = sum(p.shape[1] for p in prompts) / len(prompts)
    typical = min(prompts, key=lambda p: abs(p.shape[1] - mean_length))
    return speculative_generate(target, None, typical, max_new_tokens=max_new_tokens // 2, eos_token_id=[]).sequences


def format_breakdown(result: dict) -> str:
    """The step times and the table of `breakdown`'s `result`, in Markdown."""
    lines = []
    for engine, plain in result["step_times"].items():
        for label, t in (("without a head", plain), ("ada with the head", result["judged_step_times"][engine])):
            lines.append(f"{engine} step times {label} (ms, {t['device']}, {t['threads']} thread(s), context "
                         f"{result['context_tokens'][engine]} tokens): target alone {t['target_alone_ms']:.2f}; judgement "
                         f"{t['judge_ms']:.3f}; round overhead {t['round_overhead_ms']:.3f}\n  draft step "
                         f"j=1..{len(t['draft_ms'])}: " + " ".join(f"{v:.2f}" for v in t["draft_ms"])
                         + f"\n  verify k=0..{len(t['verify_ms']) - 1}: " + " ".join(f"{v:.2f}" for v in t["verify_ms"]))
        for capacity, other in result.get("step_times_at_other_capacities", {}).get(engine, {}).items():
            t, judged = other["plain"], other["judged"]
            lines.append(f"{engine} step times on {capacity}-token engines ({other['prompts']} prompts, context "
                         f"{other['context_tokens']} tokens): target alone {t['target_alone_ms']:.2f}; draft step "
                         f"j=1, last {t['draft_ms'][0]:.2f} {t['draft_ms'][-1]:.2f} (judged {judged['draft_ms'][0]:.2f} "
                         f"{judged['draft_ms'][-1]:.2f})"
                         f"\n  verify k=0..{len(t['verify_ms']) - 1}: " + " ".join(f"{v:.2f}" for v in t["verify_ms"]))
    reference = result["reference_ms_per_token"] is not None
    lines += ["", "| engine | method | measured ms/tok | predicted ms/tok | measured / predicted | speedup "
              + ("| over reference " if reference else "") + "| eager / this | target calls/tok | draft calls/tok "
              "| drafting ms/tok (predicted) | verifying ms/tok (predicted) | stop decision ms/draft step "
              "| loop's own ms/round |",
              "| --- | --- | ---: | ---: | ---: | ---: " + ("| ---: " if reference else "") + "| ---: | ---: | ---: "
              "| ---: | ---: | ---: | ---: |"]
    if reference:
        lines.append(f"| - | reference | {result['reference_ms_per_token']:.3f} | | | | 1.00x | | 1.000 | | | | | |")
    for row in result["rows"]:
        decision = "-" if row["stop_decision_ms_per_draft_step"] is None else f"{row['stop_decision_ms_per_draft_step']:.3f}"
        gain = "-" if row["eager_over_this"] is None else f"{row['eager_over_this']:.2f}x"
        over = f"| {row['speedup_over_reference']:.2f}x " if reference else ""
        method = f"{row['method']} ({row['stop_threshold']:g})" if row["method"].endswith("@auto") else row["method"]
        lines.append(f"| {row['engine']} | {method} | {row['measured_ms_per_token']:.3f} | "
                     f"{row['predicted_ms_per_token']:.3f} | {row['ratio']:.3f} | {row['speedup']:.2f}x {over}| {gain} | "
                     f"{row['target_calls_per_token']:.3f} | {row['draft_calls_per_token']:.3f} | "
                     f"{row['draft_ms_per_token']:.3f} ({row['predicted_draft_ms_per_token']:.3f}) | "
                     f"{row['verify_ms_per_token']:.3f} ({row['predicted_verify_ms_per_token']:.3f}) | {decision} | "
                     f"{row['loop_ms_per_round']:.3f} |")
    return "\n".join(lines + [""] + ada_over_dynamic(result["rows"]))


def ada_over_dynamic(rows: list[dict]) -> list[str]:
    """Per engine, each `ada` method's tokens/s over the fastest `dynamic`'s, measured and predicted, with the
    interval that 90% of resamples of the prompts give (how far the prompt set alone moves the measured ratio)."""
    lines = []
    for engine in dict.fromkeys(row["engine"] for row in rows):
        of_engine = [row for row in rows if row["engine"] == engine]
        dynamic = [row for row in of_engine if row["method"].startswith("dynamic@")]
        if not dynamic:
            continue
        fastest = min(dynamic, key=lambda row: row["measured_ms_per_token"])
        predicted = min(row["predicted_ms_per_token"] for row in dynamic)
        for ada in (row for row in of_engine if row["method"].startswith("ada@")):
            low, high = prompt_interval(ada["wall_ms_by_prompt"], fastest["wall_ms_by_prompt"])
            lines.append(f"{engine}: {ada['method']} tokens/s over the fastest dynamic ({fastest['method']}) "
                         f"{fastest['measured_ms_per_token'] / ada['measured_ms_per_token']:.3f}x (90% of prompt "
                         f"resamples {low:.3f}-{high:.3f}x); its counts predict "
                         f"{predicted / ada['predicted_ms_per_token']:.3f}x")
    return lines


def prompt_interval(ms: list[float], baseline_ms: list[float], coverage: float = 0.9, draws: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """The central `coverage` interval of `sum(baseline_ms) / sum(ms)` over the same prompts drawn with
    replacement (a bootstrap over prompts; each prompt's two times stay paired)."""
    pairs = torch.tensor([ms, baseline_ms], dtype=torch.float64)
    picks = torch.randint(pairs.shape[1], (draws, pairs.shape[1]), generator=torch.Generator().manual_seed(seed))
    resampled = pairs[:, picks].sum(-1)
    ratios = resampled[1] / resampled[0]
    tail = (1 - coverage) / 2
    return ratios.quantile(tail).item(), ratios.quantile(1 - tail).item()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=TARGET)
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--head", default=HEAD)
    parser.add_argument("--data_path", default="stdlib-heldout", help="a prompt set, file or Hub dataset")
    parser.add_argument("--n_begin", type=int, default=0)
    parser.add_argument("--n_end", type=int, default=13)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--bound", type=int, nargs=2, default=None, help="ada's bound (default: the head's stored one)")
    parser.add_argument("--stop_threshold", nargs="+", default=["auto"],
                        help="ada's thresholds ('auto': the head's, chosen again with each engine's step times here)")
    parser.add_argument("--confidence", type=float, nargs="+", default=[0.3, 0.4, 0.5],
                        help="dynamic's assistant_confidence_threshold values")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engine", nargs="+", choices=("eager", "compiled"), default=["eager"],
                        help="engines to run, side by side in one run (compiled: static caches, compiled steps)")
    parser.add_argument("--output_json", default=None, help="also write the table and step times here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    target, draft, head = load_pair(args.target, args.draft, args.head)
    prompts = load_prompt_ids(args.data_path, args.target, args.n_begin, args.n_end)
    bound = head_bound(head, args.bound)
    result = breakdown(target, draft, head, prompts, methods(head, bound, args.stop_threshold, args.confidence),
                       list(dict.fromkeys(args.engine)), args.max_new_tokens, bound)
    print(f"{len(prompts) - 1} prompts of {args.data_path} (after one warm-up), {args.max_new_tokens} new tokens, "
          f"greedy; ada bound {bound}; compiling took {result['compile_seconds']:.1f} s (not timed)")
    print(format_breakdown(result))
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({key: value for key, value in result.items()
                                                      if key != "outputs"}, indent=2) + "\n")
    return result


def head_bound(head: AcceptancePredictionHead, bound: list[int] | None) -> tuple[int, int]:
    """`ada`'s bound: `bound` when given, else the one the head's threshold was chosen for, else the default."""
    return tuple(bound or (head.threshold_selection or {}).get("bound") or default("bound"))


if __name__ == "__main__":
    main()
