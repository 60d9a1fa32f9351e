"""The GPU check: everything only a GPU shows, in one command that writes its results to a folder.

1. The zoo pair in float32 (and, asked, bfloat16), both engines: every schedule's greedy output against
   `target.generate`'s (a difference where the target's top-two logits are within
   `metrics.NEAR_TIE_MARGIN` is named a near-tie), and ms/token beside what its counts predict,
   methods interleaved with `target.generate` (`time_breakdown.breakdown`).
2. Token trees against chains on the zoo pair, on the last engine asked (`token_tree.py`, trees scored by
   `checkpoints/zoo/head-tree`): tokens per target call and ms/token beside what the counts predict at step
   times timed there.
3. Where a compiled round's time goes: a profiler summary of `ada` and `dynamic` generations (the
   top operators, the host syncs per generated token, a verification's ms in the generation) and of
   one pass of the step probe that prices `auto` (its verifications' ms beside the generations').
4. Which compiled draft steps of real generations run over the step probe's price: each timed by its place
   in the round and the tokens it feeds the draft (two after a round accepted whole); draft steps and
   verifications by their round's place in the generation.
5. Step times, compile seconds and GPU busy time of random-weight pairs of real shapes, compiled
   (`compiled_steps.time_pair`: a SmolLM2-135M-shaped draft with a 1.7B-shaped target and, asked,
   an 8B-shaped one).

Sections run in that order and each is written as soon as it ends; one that would end after
`--budget_s` (at the seconds it took on one H200, `SECTION_SECONDS`) is skipped and says so. It needs transformers >= 5.24 for the compiled engine (older:
the eager engine alone, and the summary says which wheel to carry).

    python benchmarks/gpu_check.py --out results/gpu-check              # one H100/H200, at most 6 minutes
    python benchmarks/gpu_check.py --out DIR --budget_s 600             # the 1.7B-shaped pair too
    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu  # the CPU smoke run (the tests')
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import compiled_steps
import token_tree
import torch
from harness import DRAFT, HEAD, TARGET, ZOO, load_pair, load_prompt_ids, rotated, warm_up
from time_breakdown import breakdown, format_breakdown, head_bound, methods, typical_context

from specdecpp import speculative_generate
from specdecpp.compat import COMPILE_GUARD_FILTER, STATIC_CACHE_CROPS, TRANSFORMERS_VERSION
from specdecpp.engine import compiled, decoding
from specdecpp.measuring.step_timing import StepProbe, device_step_times
from specdecpp.measuring.metrics import NEAR_TIE_MARGIN

SYNC_EVENTS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync")
# Launches: a step replayed as a CUDA graph is one cudaGraphLaunch, else a kernel launch per kernel.
LAUNCH_EVENTS = ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")
# The host's work before a compiled graph runs: its guards, fetching its inputs, the AOT wrapper.
GRAPH_ENTRY_EVENTS = ("TorchDynamo Cache Lookup", "Pregraph bytecode", "AOTDispatcher Runtime Wrapper Prologue")


def greedy_identity(target, prompts: list[torch.Tensor], outputs: dict, reference: list[torch.Tensor]) -> dict:
    """Per method: how many outputs equal the reference, and for each that differs, where and the
    target's top-two logit margin there (a near-tie below `NEAR_TIE_MARGIN`)."""
    report = {}
    for (engine, name), sequences in outputs.items():
        if engine == "reference":
            continue
        same, ties, failures = 0, [], []
        for prompt, got, want in zip(prompts, sequences, reference):
            if torch.equal(got.cpu(), want.cpu()):
                same += 1
                continue
            n = min(got.shape[1], want.shape[1])
            differ = (got[0, :n].cpu() != want[0, :n].cpu()).nonzero()
            where = int(differ[0]) if len(differ) else n
            with torch.inference_mode():
                logits = target(want[:, :where].to(target.device)).logits[0, -1]
            top = logits.float().topk(2).values
            margin, step = float(top[0] - top[1]), logit_step(float(top[0]), logits.dtype)
            (ties if margin < max(NEAR_TIE_MARGIN, 2 * step) else failures).append(
                {"prompt_tokens": prompt.shape[1], "position": where - prompt.shape[1], "margin": margin,
                 "dtype_steps": margin / step})
        report[f"{engine} {name}"] = {"identical": same, "of": len(sequences), "near_ties": ties, "failures": failures}
    return report


def logit_step(value: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype`'s numbers at `value`: two logits closer than a step or two are a tie
    that the rounding of another kernel may break either way."""
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(abs(value), torch.finfo(dtype).tiny)))


def zoo_section(dtype: str, device: str, n_prompts: int, max_new_tokens: int, engines: list[str], quick: bool,
                thresholds: list[str], head_path: str = HEAD) -> dict:
    """Section 1 for one dtype: identity and ms/token of every method, as a dict. Beside `ada` at
    `thresholds`, `ada@device` is `auto` chosen for this device's step times on the last engine."""
    target, draft, head = load_pair(TARGET, DRAFT, head_path, dtype)
    target, draft, head = target.to(device), draft.to(device), head.to(device)
    prompts = [p.to(device) for p in load_prompt_ids("stdlib-heldout", TARGET, 0, n_prompts)]
    bound = head_bound(head, None)
    table = methods(head, bound, thresholds)
    if quick:
        table = {name: table[name] for name in ("target alone", "dynamic@0.4", "ada@auto")}
    device_times = None
    if (head.threshold_selection or {}).get("round_weights"):
        with tempfile.TemporaryDirectory() as cache:
            device_times = device_step_times(target, draft, head, compile=engines[-1] == "compiled",
                                             repeats=2 if quick else 4, cache_dir=Path(cache))
        table["ada@device"] = dict(schedule="ada", head=head, stop_threshold="auto", step_times=device_times,
                                   bound=bound)

    def reference(prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
        synchronize(device)
        return out

    reference(prompts[0], 4)  # target.generate's own first-call work, untimed
    result = breakdown(target, draft, head, prompts, table, engines, max_new_tokens, bound, reference=reference,
                       probe_length=4 if quick else None)
    identity = greedy_identity(target, prompts, result["outputs"], result["outputs"]["reference", None])
    del result["outputs"]
    return {"dtype": dtype, "prompts": n_prompts, "max_new_tokens": max_new_tokens, "bound": bound,
            "stored_threshold": head.stop_threshold,
            "device_threshold": head.threshold_for(device_times) if device_times else None,
            "device_step_times": device_times.as_dict() if device_times else None, "identity": identity, **result}


# About what each section takes on one H200 (the 8B-shaped pair's a guess).
SECTION_SECONDS = {"zoo": 230, "trees": 120, "profile": 20, "draft-steps": 30, "shapes-1.7b": 200, "shapes-8b": 300, "shapes-tiny": 0}
PROFILED = (("float32", "compiled", "ada@auto"), ("float32", "compiled", "dynamic@0.4"))


def profile_section(device: str, max_new_tokens: int, runs: tuple[tuple[str, str, str], ...] = PROFILED,
                    head_path: str = HEAD) -> dict:
    """Section 2: one generation of the zoo pair per `(dtype, engine, method)` of `runs` under the
    profiler, after a warm-up: the top operators by self time, and host syncs per token."""
    from torch.profiler import ProfilerActivity, profile
    prompt = load_prompt_ids("stdlib-heldout", TARGET, 0, 1)[0].to(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    report, pairs = {}, {}
    for dtype, engine, name in runs:
        if dtype not in pairs:
            pairs[dtype] = [model.to(device) for model in load_pair(TARGET, DRAFT, head_path, dtype)]
        target, draft, head = pairs[dtype]
        knobs = methods(head, head_bound(head, None), ["auto"])[name]

        def generate():
            return speculative_generate(target, None if knobs["schedule"] == "none" else draft, prompt,
                                        max_new_tokens=max_new_tokens, eos_token_id=[],
                                        compile=engine == "compiled", **knobs)
        generate()
        with profile(activities=activities) as prof:
            out = generate()
            synchronize(device)
        events = prof.key_averages()
        tokens = out.stats.generated_length
        sort = "self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total"
        report[f"{name} ({dtype}, {engine})"] = {"engine": engine, "tokens": tokens,
                        "stats_ms_per_token": {part: 1000 * getattr(out.stats, part) / tokens
                                               for part in ("wall_time", "draft_time", "verify_time", "schedule_time")},
                        "verify_ms_per_call": 1000 * out.stats.verify_time / out.stats.target_calls,
                        "mean_verified": sum(out.stats.verified_lengths) / out.stats.target_calls,
                        "syncs_per_token": {e.key: e.count / tokens for e in events if e.key in SYNC_EVENTS},
                        "launches_per_token": {e.key: e.count / tokens for e in events if e.key in LAUNCH_EVENTS},
                        "graph_entry_ms_per_token": {e.key: e.self_cpu_time_total / 1000 / tokens for e in events
                                                     if e.key in GRAPH_ENTRY_EVENTS},
                        "table": events.table(sort_by=sort, row_limit=15)}
    if any(engine == "compiled" for _, engine, _ in runs):
        target, draft, _ = pairs["float32"]
        probe = StepProbe(target, draft, prompt, max_draft=4, compile=True)
        with profile(activities=activities) as prof:
            probe.sample()
            synchronize(device)
        events = prof.key_averages()
        report["step probe (float32, compiled)"] = {
            "engine": "compiled", "verify_ms": probe.times().verify_ms_measured,
            "syncs_per_pass": {e.key: e.count for e in events if e.key in SYNC_EVENTS + LAUNCH_EVENTS},
            "table": events.table(sort_by="self_cpu_time_total", row_limit=15)}
    return report


DRAFT_STEP_METHODS = ("constant K=3", "dynamic@0.4", "ada@auto")
ROUND_SPANS = ((1, 5), (6, 10), (11, 20), (21, math.inf))  # rounds by their place in the generation, the first 0


def draft_steps_section(device: str, n_prompts: int, max_new_tokens: int, head_path: str = HEAD,
                        names: tuple[str, ...] = DRAFT_STEP_METHODS) -> dict:
    """Section 3: every compiled draft step and verification of real generations of `names`, timed one by one,
    beside the step probe's price: the draft steps by their place in the round (`j`) and the tokens they feed the
    draft (two after a round accepted whole), both by their round's place in the generation (right after reading the
    prompt a CPU runs slower than the probe's prices): which steps run over."""
    target, draft, head = (model.to(device) for model in load_pair(TARGET, DRAFT, head_path, "float32"))
    prompts = [p.to(device) for p in load_prompt_ids("stdlib-heldout", TARGET, 0, n_prompts)]
    bound = head_bound(head, None)
    table = {name: methods(head, bound, ["auto"])[name] for name in names}
    steps, verifications = [], []  # (method, round, j, tokens fed, ms) and (method, round, drafted, ms)
    method, round_index = [None], [0]
    original_step, original_verify = compiled.CompiledDraft.draft_step, decoding.verify

    def timed_step(self, tokens, num_drafted, generator):
        fed, start = len(tokens) - self.length, time.perf_counter()
        step = original_step(self, tokens, num_drafted, generator)
        if method[0] is not None:
            steps.append((method[0], round_index[0], num_drafted, fed, 1000 * (time.perf_counter() - start)))
        return step

    def timed_verify(target_model, seq, drafted, *rest):
        start = time.perf_counter()
        out = original_verify(target_model, seq, drafted, *rest)
        if method[0] is not None:
            verifications.append((method[0], round_index[0], len(drafted), 1000 * (time.perf_counter() - start)))
        round_index[0] += 1
        return out

    def generate(name, prompt):
        round_index[0] = 0
        return speculative_generate(target, draft, prompt, max_new_tokens=max_new_tokens, eos_token_id=[],
                                    compile=True, **table[name])

    compiled.CompiledDraft.draft_step, decoding.verify = timed_step, timed_verify
    try:
        warm_up(lambda name, prompt, tokens: generate(name, prompt).stats, list(names), prompts, max_new_tokens,
                compile=True)
        context = typical_context(target, prompts[1:] or prompts, max_new_tokens)
        probes = {kind: StepProbe(target, draft, context, bound[1], head=head if kind == "judged" else None,
                                  compile=True, max_length=context.shape[1] + max_new_tokens)
                  for kind in ("plain", "judged")}
        for i, prompt in enumerate(prompts[1:]):
            for name in rotated(list(names), i):
                method[0] = name
                generate(name, prompt)
                method[0] = None
            for probe in probes.values():
                probe.sample()
    finally:
        compiled.CompiledDraft.draft_step, decoding.verify = original_step, original_verify
    times = {kind: probe.times() for kind, probe in probes.items()}
    price = {name: times["judged" if table[name]["schedule"] == "ada" else "plain"] for name in names}
    places = {name: {} for name in names}  # method -> a step's place -> its (j, ms)
    spans = {name: {} for name in names}  # method -> its rounds' span -> ([(draft ms, price)], [(verify ms, price)])
    for name, r, j, fed, ms in steps:
        places[name].setdefault(draft_step_place(j, fed), []).append((j, ms))
        if (span := round_span(r)) is not None:
            spans[name].setdefault(span, ([], []))[0].append((ms, clamped(price[name].draft_ms, j - 1)))
    for name, r, k, ms in verifications:
        if (span := round_span(r)) is not None:
            spans[name].setdefault(span, ([], []))[1].append((ms, clamped(price[name].verify_ms, k)))
    report, by_round = {}, {}
    for name in names:
        report[name] = {group: {"steps": len(rows), "median_ms": statistics.median(ms for _, ms in rows),
                                "probe_ms": statistics.median(clamped(price[name].draft_ms, j - 1) for j, _ in rows)}
                        for group, rows in sorted(places[name].items())}
        by_round[name] = {f"{low}-{high if high < math.inf else 'end'}": {
            "rounds": len(verified), "verify_over_price": over_price(verified),
            "draft_over_price": over_price(drafted) if drafted else None}
            for (low, high), (drafted, verified) in sorted(spans[name].items()) if verified}
    return {"prompts": n_prompts, "max_new_tokens": max_new_tokens,
            "probe_draft_ms": {kind: t.draft_ms for kind, t in times.items()},
            "probe_verify_ms": {kind: t.verify_ms for kind, t in times.items()}, "by_method": report,
            "by_round": by_round}


def round_span(place: int) -> tuple[int, float] | None:
    """The span of `ROUND_SPANS` a round's place in its generation falls in (None: the first, which reads the prompt)."""
    return next((span for span in ROUND_SPANS if span[0] <= place <= span[1]), None)


def over_price(timed: list[tuple[float, float]]) -> float:
    """Measured over priced, both summed, of `(ms, price)` pairs."""
    return sum(ms for ms, _ in timed) / sum(price for _, price in timed)


def clamped(prices: list[float], index: int) -> float:
    """`prices[index]`, the last price for an index past them (a round longer than the probe's)."""
    return prices[min(index, len(prices) - 1)]


def draft_step_place(j: int, fed: int) -> str:
    """Where a draft step stands: its place `j` in the round and, first in a round, the tokens it feeds the draft."""
    if j > 1:
        return "j=2" if j == 2 else "j>=3"
    return {1: "j=1, one token fed", 2: "j=1, two fed"}.get(fed, "j=1, three or more fed (the prompt, or a draft "
                                                                 "left behind)")


class CudaGraphLog(logging.Handler):
    """Inductor's CUDA-graph log: its warnings (a graph run without CUDA graphs and why, or recorded for too
    many input sizes) with their counts, and when (`time.perf_counter`) each CUDA graph was recorded."""

    def __init__(self):
        super().__init__()
        self.reasons: dict[str, int] = {}
        self.recorded_at: list[float] = []
        torch._logging.set_logs(cudagraphs=True)
        for module in ("cudagraph_utils", "cudagraph_trees"):
            logging.getLogger(f"torch._inductor.{module}.__cudagraphs").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.name.startswith("torch._inductor.cudagraph_trees"):
            if "Recording function=" in message:
                self.recorded_at.append(time.perf_counter())
            return
        reason = message.splitlines()[0][:300]
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def environment(device: str) -> dict:
    """What ran the check, and what it needs."""
    needs = [] if STATIC_CACHE_CROPS else [
        f"transformers {TRANSFORMERS_VERSION} is installed; the compiled engine needs >= 5.24: carry its wheel "
        "(and regex's) beside the project and install them first (the device tool's README says how)"]
    return {"device": compiled_steps.device_name(device), "torch": torch.__version__,
            "transformers": TRANSFORMERS_VERSION,
            "graph_guards": "the engine's guards" if COMPILE_GUARD_FILTER else "every guard", "needs": needs}


def main(argv: list[str] | None = None) -> dict:
    """Run the sections within the budget, writing each to `--out`; returns what was written."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for summary.md and the sections' JSON")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="few prompts and tokens, the tiny shapes (CPU smoke run)")
    parser.add_argument("--prompts", type=int, default=None, help="zoo prompts, the first a warm-up (default 9; quick 2)")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default 96; quick 12")
    parser.add_argument("--dtypes", nargs="+", default=None, help="zoo dtypes (default float32; bfloat16 too)")
    parser.add_argument("--pairs", nargs="+", default=None, choices=sorted(compiled_steps.PAIRS),
                        help="real-shape pairs (default 1.7b; 8b too; quick tiny)")
    parser.add_argument("--ada_thresholds", nargs="+", default=None,
                        help="ada's thresholds beside ada@device (default auto 0.2 0.35; quick auto)")
    parser.add_argument("--engines", nargs="+", choices=("eager", "compiled"), default=["eager", "compiled"])
    parser.add_argument("--head", default=HEAD, help="the zoo draft's head that ada judges with")
    parser.add_argument("--budget_s", type=float, default=360.0,
                        help="no section starts that would end after this many seconds")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    prompts = args.prompts or (2 if args.quick else 9)
    max_new_tokens = args.max_new_tokens or (12 if args.quick else 96)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(args.device)
    engines = [engine for engine in args.engines if STATIC_CACHE_CROPS or engine == "eager"]
    summary = [f"# GPU check on {env['device']}", "",
               f"torch {env['torch']}, transformers {env['transformers']}; engines {', '.join(engines)}; "
               f"compiled graphs check {env['graph_guards']}. "
               f"Command: `python benchmarks/gpu_check.py {' '.join(sys.argv[1:] if argv is None else argv)}`"]
    summary += [f"- needs: {need}" for need in env["needs"]]
    written = {"environment": env}
    cudagraph_log = CudaGraphLog()

    def section(name: str, run, expected: int) -> None:
        elapsed = time.perf_counter() - started
        if elapsed + expected > args.budget_s:
            summary.extend(["", f"## {name}", "", f"skipped: {elapsed:.0f} s spent and it takes about {expected} s, "
                                                  f"past the {args.budget_s:.0f} s budget"])
        else:
            begin = time.perf_counter()
            try:
                text, data = run()
            except Exception:  # one failing section must not cost the others their run on a lent machine
                text, data = f"failed:\n\n```\n{traceback.format_exc()}```", {"failed": traceback.format_exc()}
            summary.extend(["", f"## {name} ({time.perf_counter() - begin:.0f} s)", "", text])
            written[name] = data
            (out / f"{name.split()[0].lower()}.json").write_text(json.dumps(written[name], indent=1, default=str) + "\n")
        env["cudagraph_skips"] = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
        env["cudagraph_warnings"] = cudagraph_log.reasons
        (out / "summary.md").write_text("\n".join(summary + [
            "", f"## CUDA graphs: {env['cudagraph_skips']} graph(s) run without them; inductor's warnings", "",
            json.dumps(cudagraph_log.reasons, indent=1)]) + "\n")
        print(summary[-1], flush=True)

    for dtype in args.dtypes or ["float32"]:
        def zoo(dtype=dtype):
            result = zoo_section(dtype, args.device, prompts, max_new_tokens, engines, args.quick,
                                 args.ada_thresholds or (["auto"] if args.quick else ["auto", "0.2", "0.35"]), args.head)
            result["cudagraphs_recorded_while_timed"] = sum(
                result["timed_from"] <= t <= result["timed_until"] for t in cudagraph_log.recorded_at)
            lines = [f"{prompts - 1} stdlib-heldout prompts after a warm-up, {max_new_tokens} tokens, greedy, EOS off; "
                     f"ada bound {result['bound']}; compiling took {result['compile_seconds']:.1f} s; reference: "
                     "`target.generate`, interleaved with the methods; the head's stored threshold "
                     f"{result['stored_threshold']}, chosen again for this device's {engines[-1]} step times: "
                     f"{result['device_threshold']} (`ada@device`); CUDA graphs recorded while methods were timed: "
                     f"{result['cudagraphs_recorded_while_timed']}", "",
                     "| method | identical | near-ties | failures |", "| --- | ---: | ---: | ---: |"]
            lines += [f"| {name} | {r['identical']}/{r['of']} | {len(r['near_ties'])} | {len(r['failures'])} |"
                      for name, r in result["identity"].items()]
            return "\n".join(lines) + "\n\n" + format_breakdown(result), result
        section(f"zoo-{dtype} pair", zoo, SECTION_SECONDS["zoo"])

    def trees():
        report = token_tree.main(["--device", args.device, "--head", args.head, "--n_begin", "1",
                                  "--n_end", str(prompts), "--max_new_tokens", str(max_new_tokens), "--time_steps",
                                  "--tree_heads", str(ZOO / "head-tree"), "--ada_tree_thresholds", "auto", "0.8"]
                                 + (["--compile"] if engines[-1] == "compiled" else [])
                                 + (["--confidences", "0.4", "--constants", "3", "--tree_confidences", "0.9"]
                                    if args.quick else []))
        return (f"token trees against chains, {engines[-1]} (`benchmarks/token_tree.py`), {prompts - 1} stdlib-heldout prompts, "
                f"{max_new_tokens} tokens, greedy, predicted at {report['step_times']}\n\n{report['table']}"), report
    section("trees of tokens", trees, SECTION_SECONDS["trees"])

    def profiled():
        runs = (("float32", engines[-1], "ada@auto"),) if args.quick else PROFILED
        report = profile_section(args.device, max_new_tokens, runs, args.head)
        text = "\n\n".join(f"{name}, {r['tokens']} tokens: stats ms/token "
                           + json.dumps({k: round(v, 3) for k, v in r["stats_ms_per_token"].items()})
                           + "; host syncs per token " + json.dumps({k: round(v, 2) for k, v in r["syncs_per_token"].items()})
                           + "; launches per token " + json.dumps({k: round(v, 2) for k, v in r["launches_per_token"].items()})
                           + "; host ms per token entering graphs " + json.dumps(
                               {k: round(v, 3) for k, v in r["graph_entry_ms_per_token"].items()})
                           + f"; a verification of {r['mean_verified']:.2f} drafted: {r['verify_ms_per_call']:.3f} ms"
                           + f"\n\n```\n{r['table']}\n```" for name, r in report.items() if "tokens" in r)
        text += "".join(f"\n\n{name}, one pass: verification ms for k=0..4 drafted "
                        + " ".join(f"{v:.3f}" for v in r["verify_ms"]) + "; host syncs and launches per pass "
                        + json.dumps(r["syncs_per_pass"]) + f"\n\n```\n{r['table']}\n```"
                        for name, r in report.items() if "tokens" not in r)
        return text, report
    section("profile of a round", profiled, SECTION_SECONDS["profile"])

    if "compiled" in engines:
        def draft_steps():
            report = draft_steps_section(args.device, prompts, max_new_tokens, args.head,
                                         ("dynamic@0.4", "ada@auto") if args.quick else DRAFT_STEP_METHODS)
            lines = ["| method | draft step | steps | median ms | probe's price |", "| --- | --- | ---: | ---: | ---: |"]
            lines += [f"| {name} | {group} | {row['steps']} | {row['median_ms']:.3f} | {row['probe_ms']:.3f} |"
                      for name, groups in report["by_method"].items() for group, row in groups.items()]
            lines += ["", "| method | rounds after the one that reads the prompt | verifications | draft steps, measured / "
                      "priced | verifications, measured / priced |", "| --- | --- | ---: | ---: | ---: |"]
            lines += [f"| {name} | {span} | {row['rounds']} | "
                      + ("-" if row["draft_over_price"] is None else f"{row['draft_over_price']:.3f}")
                      + f" | {row['verify_over_price']:.3f} |"
                      for name, spans in report["by_round"].items() for span, row in spans.items()]
            return "\n".join(lines), report
        section("draft steps in generations", draft_steps, SECTION_SECONDS["draft-steps"])

    # Real shapes compiled only (eager runs ten times slower), unless quick.
    shape_engines = tuple(engines) if args.quick or "compiled" not in engines else ("compiled",)
    for pair in args.pairs or (["tiny"] if args.quick else ["1.7b"]):
        def shapes(pair=pair):
            result = compiled_steps.time_pair(pair, args.device, torch.float32 if args.quick else torch.bfloat16,
                                              context=128, max_draft=8, passes=3 if args.quick else 5,
                                              engines=shape_engines)
            return compiled_steps.format_result(result), result
        section(f"shapes-{pair} pair", shapes, SECTION_SECONDS[f"shapes-{pair}"])
    return written


if __name__ == "__main__":
    main()
