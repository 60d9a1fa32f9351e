"""Eager against compiled steps for pairs of real sizes: random-weight models built from configs (no
download), timed on whatever device is given.

Pairs: a SmolLM2-135M-like draft with a SmolLM2-1.7B-like target and, when `--pairs` includes it,
a Llama-3-8B-like target (its shape, with the draft's vocabulary so that the pair can speculate).
For each pair and engine (`specdecpp.measuring.step_timing.StepProbe`: the loop's own steps, rounds of every
length as the loop takes them, engines interleaved pass by pass) it prints the draft step, the head's
judgement, the target-alone step, the verification of k drafted tokens, and a whole round of k
drafted tokens without and with a head judging each one (`StepTimes.round_ms`), eager beside
compiled, with the compile time. On a GPU it also profiles the compiled draft step, target-alone
step and verification: the GPU's busy time (its kernels' total) beside the wall time per call, so
what is the GPU's work and what the host's shows. Random weights make acceptance meaningless, so it
times steps and rounds, not generations; the time-breakdown benchmark does those on a trained pair.

    python benchmarks/compiled_steps.py --device cuda                      # bf16, 135M draft, 1.7B target
    python benchmarks/compiled_steps.py --device cuda --pairs 1.7b 8b      # also the 8B-like target
    python benchmarks/compiled_steps.py --pairs tiny --dtype float32       # tiny models (what the tests run)
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdecpp import AcceptancePredictionHead
from specdecpp.costs import StepTimes
from specdecpp.measuring.step_timing import EngineSteps, StepProbe, measure_round_overhead

# Llama-family shapes: (hidden, intermediate, layers, attention heads, key-value heads).
SHAPES = {
    "smollm2-135m": (576, 1536, 30, 9, 3),
    "smollm2-1.7b": (2048, 8192, 24, 32, 32),
    "llama3-8b": (4096, 14336, 32, 32, 8),
    "tiny-draft": (32, 64, 2, 4, 2),
    "tiny-target": (64, 128, 3, 4, 2),
}
# pair name -> (draft shape, target shape, vocabulary)
PAIRS = {"1.7b": ("smollm2-135m", "smollm2-1.7b", 49152), "8b": ("smollm2-135m", "llama3-8b", 49152),
         "tiny": ("tiny-draft", "tiny-target", 256)}
ROUND_LENGTHS = (1, 2, 4, 8)
ENGINES = ("eager", "compiled")


def random_model(shape: str, vocab: int, dtype: torch.dtype, device: str, seed: int) -> LlamaForCausalLM:
    """A Llama-family causal LM of `shape` with random weights."""
    hidden, intermediate, layers, heads, kv_heads = SHAPES[shape]
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=4096, tie_word_embeddings=shape == "smollm2-135m")
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def time_pair(pair: str, device: str, dtype: torch.dtype, context: int, max_draft: int, passes: int,
              engines: tuple[str, ...] = ENGINES) -> dict:
    """Step and round times of each of `engines` for `pair` (see the module docstring), as a dict."""
    draft_shape, target_shape, vocab = PAIRS[pair]
    draft = random_model(draft_shape, vocab, dtype, device, seed=0)
    target = random_model(target_shape, vocab, dtype, device, seed=1)
    head = AcceptancePredictionHead(draft.config.hidden_size, num_layers=2, alignment="proposer",
                                    features=["log_q", "entropy", "margin"]).to(device)
    input_ids = torch.randint(vocab, (1, context), generator=torch.Generator().manual_seed(0)).to(device)
    probes, compile_seconds = {}, 0.0
    for engine in engines:
        for kind, judge in (("plain", None), ("judged", head)):
            start = time.perf_counter()
            probes[engine, kind] = StepProbe(target, draft, input_ids, max_draft, head=judge,
                                             compile=engine == "compiled")
            if engine == "compiled":
                compile_seconds += time.perf_counter() - start
    for _ in range(passes):  # engines interleaved pass by pass: load on the machine hits both alike
        for probe in probes.values():
            probe.sample()
    times: dict[tuple[str, str], StepTimes] = {}
    for engine in engines:
        overhead = measure_round_overhead(target, draft, input_ids, runs=1, compile=engine == "compiled")
        for kind in ("plain", "judged"):
            times[engine, kind] = replace(probes[engine, kind].times(), round_overhead_ms=overhead)
    rows = [("draft step, first of a round", lambda t: t["plain"].draft_ms[0]),
            (f"draft step, {max_draft}th of a round", lambda t: t["plain"].draft_ms[-1]),
            ("draft step judged by a head (first)", lambda t: t["judged"].draft_ms[0] + t["judged"].judge_ms),
            ("target alone", lambda t: t["plain"].target_alone_ms)]
    rows += [(f"verify {k} drafted", lambda t, k=k: t["plain"].verify_ms[k]) for k in ROUND_LENGTHS if k <= max_draft]
    rows += [(f"round of {k}", lambda t, k=k: t["plain"].round_ms(k)) for k in ROUND_LENGTHS if k <= max_draft]
    rows += [(f"round of {k}, each judged", lambda t, k=k: t["judged"].round_ms(k, judged=k))
             for k in ROUND_LENGTHS if k <= max_draft]
    table = []
    for label, pick in rows:
        row = {"step": label} | {f"{engine}_ms": pick({kind: times[engine, kind] for kind in ("plain", "judged")})
                                 for engine in engines}
        if set(ENGINES) <= set(engines):
            row["gain"] = row["eager_ms"] / row["compiled_ms"]
        table.append(row)
    busy = compiled_busy_ms(target, draft, input_ids) if "compiled" in engines else {}
    return {"pair": pair, "engines": list(engines), "compiled_busy_ms": busy, "draft": draft_shape, "target": target_shape, "vocab": vocab, "dtype": str(dtype),
            "device": device_name(device), "context": context, "passes": passes,
            "compile_seconds": compile_seconds, "rows": table,
            "step_times": {f"{engine}/{kind}": t.as_dict() for (engine, kind), t in times.items()}}


def compiled_busy_ms(target, draft, input_ids: torch.LongTensor, k: int = 4, calls: int = 20) -> dict:
    """Per compiled step, `[wall ms, GPU busy ms]` a call (busy 0 on a CPU): the draft step, the
    target-alone step and the verification of `k` drafted tokens."""
    rounds, alone = (EngineSteps(target, draft, input_ids, drafted, compile=True) for drafted in (k, 0))
    steps = {"draft step": rounds.draft_step, "target alone": alone.verify, f"verify {k} drafted": rounds.verify}
    return {name: wall_and_busy_ms(step, calls, target.device.type == "cuda") for name, step in steps.items()}


def wall_and_busy_ms(step: Callable[[], None], calls: int, cuda: bool) -> list[float]:
    """`[wall ms, GPU busy ms]` per call of `step`: the busy time is its kernels' total under the
    profiler, so wall minus busy is time the GPU waited for the host."""
    from torch.profiler import ProfilerActivity, profile
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    step()
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    synchronize()
    wall = 1000 * (time.perf_counter() - start) / calls
    if not cuda:
        return [wall, 0.0]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        synchronize()
    return [wall, sum(event.self_device_time_total for event in prof.key_averages()) / 1000 / calls]


def device_name(device: str) -> str:
    """The device in words: the GPU's name, or the CPU with its thread count."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu, {torch.get_num_threads()} thread(s)"


def format_result(result: dict) -> str:
    """One pair's table in Markdown."""
    engines, gain = result["engines"], "gain" in result["rows"][0]
    lines = [f"{result['draft']} draft, {result['target']} target ({result['dtype']}, {result['device']}, context "
             f"{result['context']} tokens, {result['passes']} passes; compiling took {result['compile_seconds']:.1f} s)",
             "", "| step | " + " | ".join(f"{engine} ms" for engine in engines) + (" | eager / compiled |" if gain else " |"),
             "| --- |" + " ---: |" * (len(engines) + gain)]
    lines += ["| " + " | ".join([row["step"]] + [f"{row[f'{engine}_ms']:.3f}" for engine in engines]
                                + ([f"{row['gain']:.2f}x"] if gain else [])) + " |" for row in result["rows"]]
    if result.get("compiled_busy_ms"):
        lines += ["", "| compiled step | wall ms a call | GPU busy ms a call |", "| --- | ---: | ---: |"]
        lines += [f"| {name} | {wall:.3f} | {busy:.3f} |" for name, (wall, busy) in result["compiled_busy_ms"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    """Time every pair asked for, print the tables, write them to `--output_json`; returns them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=["1.7b"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--context", type=int, default=128, help="tokens in the caches when steps are timed")
    parser.add_argument("--max_draft", type=int, default=8, help="the longest round timed")
    parser.add_argument("--passes", type=int, default=10, help="timed passes per engine (medians are reported)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--output_json", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for pair in args.pairs:
        results.append(time_pair(pair, args.device, getattr(torch, args.dtype), args.context, args.max_draft,
                                 args.passes))
        print(format_result(results[-1]) + "\n", flush=True)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
