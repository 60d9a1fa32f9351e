"""Serving with vLLM: SpecDec++'s head in vLLM's `draft_model` loop (`specdecpp.serving.vllm_draft`)
against vLLM's own speculation.

One run, every engine alive in this process (vLLM's in-process engine, one thread each): vLLM
without speculation, vLLM's `draft_model` at K = 2..5, vLLM's `ngram`, and `draft_model` with our
head (`ada@auto` with bound [1, 20], the same capped at 5 drafted tokens, and `ada@0.3`), and the head pinned
to `draft_model`'s K=2 rounds (bound [2, 2]: it judges every token and proposes what K=2 proposes, so beside K=2
it shows what the plugin itself costs), all on the embedded pair.
For each prompt set and concurrency the prompts go in runs of `waves x concurrency` prompts, served with
`concurrency` requests in flight (a finished request replaced by the next prompt, as a server under that load
keeps them); each run is served by every engine, in an order that rotates from run to run, so load on the
machine hits every method alike. Greedy, `max_new_tokens` each (EOS ignored, so every method generates the same
number of tokens).

Per method and concurrency: output tokens/s, its median ratio over the runs to vLLM without speculation and to
`draft_model` at its best K (the K it runs slowest against: the least median ratio over K = 2..5), the same over
the steps that start with every slot in flight (steady load: a run's filling and draining left out, as a server
under that load never drains), the median request latency, vLLM's speculative counters, the requests drafted for
per engine step, target steps per generated token (each request's engine steps, prefill included), the wall time
per engine step and, of it, the time in vLLM's draft loop (our judgements included), and for our head the draft
forwards per engine step, its draft loop's time per proposed token, its rounds' price per engine step at the vLLM
prices its batch stop uses (prefills unpriced) and the accepted tokens its survival expected over those vLLM
counted. Greedy outputs are checked against vLLM without speculation. Writes `vllm_serving.md` and
`vllm_serving.json` in `--output`.

    python benchmarks/vllm_serving.py --num_prompts 96 --waves 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engines in this process: the proposer's clock is readable
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# One thread, unbound. vLLM's CPU build binds its OpenMP threads to cores; binding to one core
# (VLLM_CPU_OMP_THREADS_BIND=1) while torch keeps two threads there made a step 50x slower here.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

from harness import ZOO  # noqa: E402  (imports torch: after the thread settings)

PLAIN, DRAFT_MODEL = "vLLM, no speculation", "vLLM draft_model K="


def methods(zoo: Path) -> dict[str, dict]:
    """Each compared method's `speculative_config` and `additional_config`."""
    draft_model = lambda k: {"method": "draft_model", "model": str(zoo / "draft"), "num_speculative_tokens": k}  # noqa: E731
    head = lambda bound, threshold="auto": {"specdecpp": {"head": str(zoo / "head"), "stop_threshold": threshold,  # noqa: E731
                                                          "bound": bound}}
    grid = {PLAIN: {}}
    for k in (2, 3, 4, 5):
        grid[f"{DRAFT_MODEL}{k}"] = {"speculative_config": draft_model(k)}
    grid["ours ada@auto"] = {"speculative_config": draft_model(20), "additional_config": head([1, 20])}
    grid["ours ada@auto K<=5"] = {"speculative_config": draft_model(5), "additional_config": head([1, 5])}
    grid["ours ada@0.3"] = {"speculative_config": draft_model(20), "additional_config": head([1, 20], 0.3)}
    grid["ours pinned K=2"] = {"speculative_config": draft_model(2), "additional_config": head([2, 2])}
    # Built last: vLLM's ngram proposer imports numba, and once llvmlite is imported the CPU build's
    # start-up scan of every module (its Triton kernel overrides) fails for the engines built after it.
    grid["vLLM ngram K=5"] = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 5,
                                                     "prompt_lookup_max": 5, "prompt_lookup_min": 2}}
    return grid


def counting_engine(**engine_args):
    """An in-process `LLMEngine` with a stat logger of its own that adds up vLLM's speculative
    counters (drafts, draft tokens, accepted tokens) as its scheduler reports them: Prometheus'
    registry holds one engine's counters per process, and every engine here is alive at once."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.metrics.loggers import StatLoggerBase

    counts = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}

    class SpecCounter(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is not None:
                counts["drafts"] += spec.num_drafts
                counts["draft_tokens"] += spec.num_draft_tokens
                counts["accepted_tokens"] += spec.num_accepted_tokens

        def log_engine_initialized(self):
            pass

    engine = LLMEngine.from_engine_args(EngineArgs(**engine_args), stat_loggers=[SpecCounter])
    engine.spec_counts = counts
    return engine


def clock_draft_loops() -> None:
    """Add up the seconds every `draft_model` proposer spends in vLLM's draft loop (`propose`), ours with
    its judgements (they run inside that loop), as `loop_time`."""
    from vllm.v1.spec_decode.draft_model import DraftModelProposer

    propose = DraftModelProposer.propose

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return propose(self, *args, **kwargs)
        finally:
            self.loop_time = getattr(self, "loop_time", 0.0) + time.perf_counter() - start

    DraftModelProposer.propose = timed


def proposer_clock(engine) -> tuple[int, int, float, float, float]:
    """Our proposer's tokens proposed and draft forwards (zeros for other engines), any `draft_model`
    proposer's seconds in vLLM's draft loop, the accepted tokens our head expected of its proposals, and its
    rounds' price (ms)."""
    def read(worker):
        drafter = getattr(worker.model_runner, "drafter", None)
        return getattr(drafter, "proposed_tokens", 0), getattr(drafter, "draft_steps", 0), \
            getattr(drafter, "loop_time", 0.0), getattr(drafter, "expected_accepted", 0.0), \
            getattr(drafter, "priced_ms", 0.0)
    return tuple(engine.collective_rpc(read)[0])


def run_batch(engine, prompts: list[list[int]], max_new_tokens: int, in_flight: int | None = None) -> dict:
    """Serve `prompts` through the engine's own step loop with at most `in_flight` requests at once (default: all),
    each finished request replaced by the next prompt: the outputs, each request's latency and engine steps (from
    its arrival), the wall time and the counters' and clock's increments."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=max_new_tokens, ignore_eos=True)
    before, clock = dict(engine.spec_counts), proposer_clock(engine)
    start = time.perf_counter()
    arrived, waiting = {}, list(enumerate(prompts))[::-1]
    latency, steps, outputs, step = {}, {}, {}, 0
    produced, full_tokens, full_wall = {}, 0, 0.0  # full: the steps that start with every slot in flight

    def admit() -> None:
        while waiting and len(arrived) - len(outputs) < (in_flight or len(prompts)):
            i, ids = waiting.pop()
            arrived[str(i)] = (time.perf_counter(), step)
            engine.add_request(str(i), TokensPrompt(prompt_token_ids=ids), params)

    admit()
    while engine.has_unfinished_requests():
        step += 1
        full, began = len(arrived) - len(outputs) == (in_flight or len(prompts)), time.perf_counter()
        for out in engine.step():
            made = len(out.outputs[0].token_ids)
            full_tokens += (made - produced.get(out.request_id, 0)) * full
            produced[out.request_id] = made
            if out.finished:
                latency[out.request_id] = time.perf_counter() - arrived[out.request_id][0]
                steps[out.request_id] = step - arrived[out.request_id][1]
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        admit()
        full_wall += (time.perf_counter() - began) * full
    wall = time.perf_counter() - start
    after, clock_after = engine.spec_counts, proposer_clock(engine)
    order = [str(i) for i in range(len(prompts))]
    return {"outputs": [outputs[i] for i in order], "latency": [latency[i] for i in order],
            "steps": [steps[i] for i in order], "engine_steps": step, "wall": wall,
            "full_tokens": full_tokens, "full_wall": full_wall,
            "counters": {k: after[k] - before[k] for k in after},
            "proposed": clock_after[0] - clock[0], "draft_forwards": clock_after[1] - clock[1],
            "draft_loop_s": clock_after[2] - clock[2], "expected_accepted": clock_after[3] - clock[3],
            "priced_ms": clock_after[4] - clock[4]}


def tokens_per_s(batch: dict) -> float:
    return sum(map(len, batch["outputs"])) / batch["wall"]


def steady_tokens_per_s(batch: dict) -> float:
    """Tokens per second over the steps that start with every slot in flight (a server under steady load)."""
    return batch["full_tokens"] / batch["full_wall"] if batch["full_wall"] else float("nan")


def summarise(name: str, batches: list[dict], plain: list[dict]) -> dict:
    """One table row from a method's batches and vLLM-without-speculation's same batches."""
    tokens = sum(len(o) for b in batches for o in b["outputs"])
    steps = sum(sum(b["steps"]) for b in batches)
    total = {k: sum(b["counters"].get(k, 0) for b in batches) for k in ("drafts", "draft_tokens", "accepted_tokens")}
    proposed, forwards = sum(b["proposed"] for b in batches), sum(b["draft_forwards"] for b in batches)
    engine_steps = sum(b["engine_steps"] for b in batches)
    return {
        "method": name, "tokens_per_s": tokens / sum(b["wall"] for b in batches),
        "steady_tokens_per_s": sum(b["full_tokens"] for b in batches) / sum(b["full_wall"] for b in batches),
        "ratio_to_plain": statistics.median(tokens_per_s(b) / tokens_per_s(p) for b, p in zip(batches, plain)),
        "median_latency_s": statistics.median(x for b in batches for x in b["latency"]),
        **total, "acceptance": total["accepted_tokens"] / total["draft_tokens"] if total["draft_tokens"] else None,
        "drafts_per_engine_step": total["drafts"] / engine_steps if total["drafts"] else None,
        "target_steps_per_token": steps / tokens,
        "draft_forwards_per_step": forwards / engine_steps if forwards else None,
        "ms_per_engine_step": 1e3 * sum(b["wall"] for b in batches) / engine_steps,
        "priced_ms_per_engine_step": sum(b["priced_ms"] for b in batches) / engine_steps if proposed else None,
        "draft_loop_ms_per_engine_step": 1e3 * sum(b["draft_loop_s"] for b in batches) / engine_steps,
        "propose_ms_per_proposed": 1e3 * sum(b["draft_loop_s"] for b in batches) / proposed if proposed else None,
        "expected_over_accepted": sum(b["expected_accepted"] for b in batches) / total["accepted_tokens"]
        if proposed and total["accepted_tokens"] else None,
        "same_output_as_plain": all(b["outputs"] == p["outputs"] for b, p in zip(batches, plain)),
    }


def against_best_draft_model(rows: list[dict], results: dict[str, list[dict]]) -> None:
    """Add to each row its ratio to `draft_model` at its best K: the least, over every K, of its median per-run
    ratio to that K (in tokens/s over whole runs and at steady load alike), and that K; and its target steps per
    token over `draft_model`'s fewest at any K."""
    draft_models = [r["method"] for r in rows if r["method"].startswith(DRAFT_MODEL)]
    if not draft_models:
        return
    fewest = min(r["target_steps_per_token"] for r in rows if r["method"] in draft_models)

    def against(method: str, speed) -> tuple[float, str]:
        return min((statistics.median(speed(b) / speed(d) for b, d in zip(results[method], results[k])), k)
                   for k in draft_models)

    for row in rows:
        row["ratio_to_best_draft_model"], row["best_draft_model"] = against(row["method"], tokens_per_s)
        row["steady_ratio_to_best_draft_model"], row["steady_best_draft_model"] = against(row["method"],
                                                                                          steady_tokens_per_s)
        row["steps_to_fewest_draft_model"] = row["target_steps_per_token"] / fewest


def markdown(rows: list[dict]) -> str:
    header = ("| method | concurrency | tokens/s | vs no speculation (median) | vs best draft_model (median) | "
              "steady tokens/s | steady vs best draft_model (median) | "
              "median latency (s) | drafts | drafts/engine step | draft tokens | accepted | acceptance | target steps/token | "
              "vs fewest draft_model | draft forwards/engine step | ms/engine step | at vLLM's prices | "
              "draft loop ms/engine step | propose ms/proposed | head's expected / accepted | output = plain |\n"
              + "|---" * 22 + "|\n")
    fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
    lines = [f"| {r['method']} | {r['concurrency']} | {r['tokens_per_s']:.1f} | {r['ratio_to_plain']:.2f}x | "
             f"{fmt(r.get('ratio_to_best_draft_model'), '.2f')}x | {r['steady_tokens_per_s']:.1f} | "
             f"{fmt(r.get('steady_ratio_to_best_draft_model'), '.2f')}x | {r['median_latency_s']:.2f} | {r['drafts']:.0f} | "
             f"{fmt(r['drafts_per_engine_step'], '.2f')} | {r['draft_tokens']:.0f} | {r['accepted_tokens']:.0f} | {fmt(r['acceptance'], '.3f')} | "
             f"{r['target_steps_per_token']:.3f} | {fmt(r.get('steps_to_fewest_draft_model'), '.2f')}x | "
             f"{fmt(r['draft_forwards_per_step'], '.2f')} | {r['ms_per_engine_step']:.2f} | "
             f"{fmt(r['priced_ms_per_engine_step'], '.2f')} | "
             f"{r['draft_loop_ms_per_engine_step']:.2f} | {fmt(r['propose_ms_per_proposed'], '.3f')} | "
             f"{fmt(r['expected_over_accepted'], '.3f')} | "
             f"{r['same_output_as_plain']} |" for r in rows]
    return header + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt_sets", nargs="+", default=["stdlib-heldout", "humaneval"])
    parser.add_argument("--num_prompts", type=int, default=16, help="prompts per set (the first ones)")
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16],
                        help="requests in flight: a finished request is replaced by the next prompt")
    parser.add_argument("--waves", type=int, default=1,
                        help="prompts served per timed run, in multiples of the concurrency (1: one batch at once)")
    parser.add_argument("--methods", nargs="+", default=None, help="a subset of the methods, by name")
    parser.add_argument("--zoo", default=str(ZOO))
    parser.add_argument("--output", default="results/vllm-serving")
    args = parser.parse_args()

    from harness import load_prompt_ids, rotated

    zoo = Path(args.zoo)
    grid = {k: v for k, v in methods(zoo).items() if args.methods is None or k in args.methods}
    engine = {"distributed_executor_backend": "uni", "enforce_eager": True, "max_model_len": 1024, "dtype": "float32",
              "max_num_seqs": max(args.concurrency), "disable_log_stats": False, "seed": 0}
    clock_draft_loops()
    engines = {name: counting_engine(model=str(zoo / "target"), **config, **engine) for name, config in grid.items()}
    rows, report = [], []
    for prompt_set in args.prompt_sets:
        prompts = [ids[0].tolist() for ids in load_prompt_ids(prompt_set, str(zoo / "target"), n_end=args.num_prompts)]
        for served in engines.values():  # warm-up, untimed
            run_batch(served, prompts[:1], 16)
        for concurrency in args.concurrency:
            results = {name: [] for name in engines}
            served = concurrency * args.waves
            for b, start in enumerate(range(0, len(prompts), served)):
                for name in rotated(list(engines), b):
                    results[name].append(run_batch(engines[name], prompts[start:start + served], args.max_new_tokens,
                                                   concurrency))
            plain = results[PLAIN]
            done = [{"prompt_set": prompt_set, "concurrency": concurrency, **summarise(name, batches, plain)}
                    for name, batches in results.items()]
            against_best_draft_model(done, results)
            rows += done
            for row in done:
                print(json.dumps(row), flush=True)
        report.append(f"## {prompt_set} (prompts 0-{len(prompts) - 1}, {args.max_new_tokens} tokens, greedy)\n\n"
                      + markdown([r for r in rows if r["prompt_set"] == prompt_set]))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_serving.json").write_text(json.dumps(rows, indent=1))
    (out / "vllm_serving.md").write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()
