"""vLLM's own step times for a pair (`serving.vllm.VllmPrices`), timed inside a vLLM engine per batch size, once per
processor and kept (docs/design.md, Serving); `python -m specdecpp.serving.vllm_timing` measures in its own process."""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy
import torch

from specdecpp.costs import StepTimes, busy_machine, fit_verify_ms, pass_spread
from specdecpp.data.io import write_json
from specdecpp.measuring.step_timing import processor_name
from specdecpp.serving.vllm import (SECTION, BatchRound, StopDrafting, VllmPrices, cached_prices, priced_batch_sizes,
                                    prices_path)

TIMING_ENV = "SPECDECPP_VLLM_TIMING"  # set in the process that measures: its engine is timed, not priced
TIMED_LENGTHS = (0, 1, 2, 3, 4, 6, 8, 12, 16)  # the round lengths timed (and the longest); between them, on the line


def timed_lengths(max_draft: int) -> list[int]:
    """The round lengths timed for rounds of up to `max_draft` tokens."""
    return sorted({k for k in TIMED_LENGTHS if k < max_draft} | {max_draft})


class RoundTimer:
    """Samples (ms) of the rounds a proposer drafted: `draft[(rows, j)]` the `j + 1`-th draft forward, `verify[(rows,
    k)]` from a round of `k` drafted tokens to the next propose. Rounds draft each of `timed_lengths(max_draft)` in
    turn; a prefill (the first round after `reset`) and rounds whose batch changed are not sampled."""

    def __init__(self, max_draft: int):
        self.max_draft, self.lengths, self.rounds, self.last = max_draft, timed_lengths(max_draft), 0, None
        self.draft: dict[tuple[int, int], list[float]] = {}
        self.verify: dict[tuple[int, int], list[float]] = {}

    def reset(self) -> None:
        self.last = None

    def next_length(self) -> int:
        self.rounds += 1
        return self.lengths[(self.rounds - 1) % len(self.lengths)]

    def record(self, rows: int, k: int, start: float, marks: list[float], end: float) -> None:
        if self.last is not None and self.last[0] == rows:
            self.verify.setdefault((rows, self.last[1]), []).append(1000 * (start - self.last[2]))
            for j, (before, after) in enumerate(zip([start, *marks], marks)):
                self.draft.setdefault((rows, j), []).append(1000 * (after - before))
        self.last = (rows, k, end)

    def enough(self, rows: int, passes: int) -> bool:
        return all(len(self.verify.get((rows, k), [])) >= passes for k in self.lengths) and \
            all(len(self.draft.get((rows, j), [])) >= passes for j in range(self.max_draft))

    def times(self, rows: int, device: torch.device, engine: str) -> StepTimes:
        verify = [self.verify[(rows, k)] for k in self.lengths]
        timed = [statistics.median(ms) for ms in verify]
        measured = [float(numpy.interp(k, self.lengths, timed)) for k in range(self.max_draft + 1)]
        spread = pass_spread(verify)
        return StepTimes(draft_ms=[statistics.median(self.draft[(rows, j)]) for j in range(self.max_draft)],
                         verify_ms=fit_verify_ms(measured), target_alone_ms=measured[0], device=str(device),
                         processor=processor_name(device), threads=torch.get_num_threads(),
                         repeats=min(map(len, verify)), engine=engine, verify_ms_measured=measured, spread=spread,
                         busy=busy_machine(spread, f"{engine}'s steps at batch {rows}"))


class TimedBatchRound(BatchRound):
    """A round of exactly `timer.next_length()` tokens per row, each step judged as served, timed into `timer`."""

    def __init__(self, timer: RoundTimer, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timer, self.k, self.start, self.marks = timer, timer.next_length(), time.perf_counter(), []

    def step(self, hidden, logits, tokens, probs) -> None:
        self.tokens.append(tokens)
        self.judge(hidden, logits, tokens).tolist()  # the head's forward is part of a served step
        self.marks.append(time.perf_counter())
        if len(self.tokens) >= max(self.k, 1):
            self.lengths = [None] * len(tokens)
            for row in range(len(tokens)):
                self.stop_row(row, self.k)
            raise StopDrafting

    def proposals(self) -> list[list[int]]:
        self.timer.record(len(self.lengths), self.k, self.start, self.marks, time.perf_counter())
        return super().proposals()


def _start_timing(worker, max_draft: int) -> None:
    drafter = worker.model_runner.drafter
    drafter.timer = RoundTimer(max_draft)
    drafter.new_round = functools.partial(TimedBatchRound, drafter.timer)


def _reset_timing(worker) -> None:
    worker.model_runner.drafter.timer.reset()


def _enough(worker, rows: int, passes: int) -> bool:
    return worker.model_runner.drafter.timer.enough(rows, passes)


def _times(worker, rows: int) -> dict:
    import vllm

    device = torch.device(worker.vllm_config.device_config.device_type)
    return worker.model_runner.drafter.timer.times(rows, device, f"vllm {vllm.__version__}").as_dict()


def measure_prices(target: str, draft: str, head: str, max_draft: int, batch_sizes: list[int], passes: int = 3,
                   context: int = 32, engine: dict | None = None) -> VllmPrices:
    """`VllmPrices` timed in an engine of this process (`engine`: `LLM`'s kwargs) on random contexts."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    os.environ[TIMING_ENV] = "1"
    llm = LLM(model=target, speculative_config={"method": "draft_model", "model": draft,
                                                "num_speculative_tokens": max_draft},
              additional_config={SECTION: {"head": head, "stop_threshold": 1.0, "bound": [1, max_draft]}},
              **(engine or {}))
    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    generator = torch.Generator().manual_seed(0)
    room = llm.llm_engine.vllm_config.model_config.max_model_len - context - max_draft - 1
    params = SamplingParams(temperature=0.0, max_tokens=min(2 * (max_draft + 1) * passes, room), ignore_eos=True)

    def generate(rows: int) -> None:
        llm.collective_rpc(_reset_timing)
        llm.generate([TokensPrompt(prompt_token_ids=torch.randint(vocab, (context,), generator=generator).tolist())
                      for _ in range(rows)], params, use_tqdm=False)

    llm.collective_rpc(_start_timing, args=(max_draft,))
    for rows in batch_sizes:  # warm-up, untimed
        generate(rows)
    llm.collective_rpc(_start_timing, args=(max_draft,))
    times = {}
    for rows in batch_sizes:
        for _ in range(20 * passes):
            generate(rows)
            if llm.collective_rpc(_enough, args=(rows, passes))[0]:
                break
        times[rows] = StepTimes(**llm.collective_rpc(_times, args=(rows,))[0])
    return VllmPrices(times, max_draft)


def ensure_prices(vllm_config, head_location: str, head) -> VllmPrices:
    """This engine's `VllmPrices`: kept ones, else measured now in a process of its own and kept."""
    if (prices := cached_prices(vllm_config, head)) is not None:
        return prices
    path = prices_path(vllm_config, head)
    model, spec = vllm_config.model_config, vllm_config.speculative_config
    sizes = priced_batch_sizes(vllm_config.scheduler_config.max_num_seqs)
    print(f"specdecpp: timing this pair's steps in vLLM at batch sizes {sizes}, once; kept in {path}",
          file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "specdecpp.serving.vllm_timing", "--target", model.model,
               "--draft", spec.draft_model_config.model, "--head", head_location,
               "--max_draft", str(spec.num_speculative_tokens), "--batch_sizes", *map(str, sizes),
               "--dtype", str(model.dtype).removeprefix("torch."), "--max_model_len", str(model.max_model_len),
               "--gpu_memory_utilization", str(vllm_config.cache_config.gpu_memory_utilization),
               "--output", str(path)] + (["--enforce_eager"] if model.enforce_eager else [])
    start = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ, TIMING_ENV: "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    print(f"specdecpp: timed in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    if (prices := cached_prices(vllm_config, head)) is None:
        raise RuntimeError(f"specdecpp: timing vLLM's steps wrote no prices that cover this engine to {path}")
    return prices


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--head", required=True, help="the head's folder or Hub id")
    parser.add_argument("--max_draft", type=int, default=20, help="the longest round timed")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--passes", type=int, default=3, help="rounds of each length timed at least")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max_model_len", type=int, default=1024)
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.9)
    parser.add_argument("--enforce_eager", action="store_true")
    parser.add_argument("--output", required=True, help="the JSON file the prices are kept in")
    args = parser.parse_args(argv)
    engine = {"dtype": args.dtype, "max_model_len": args.max_model_len, "enforce_eager": args.enforce_eager,
              "gpu_memory_utilization": args.gpu_memory_utilization, "max_num_seqs": max(args.batch_sizes),
              "distributed_executor_backend": "uni", "seed": 0}
    prices = measure_prices(args.target, args.draft, args.head, args.max_draft, args.batch_sizes, args.passes,
                            engine=engine)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.output, {"key": vars(args), "prices": prices.as_dict()})


if __name__ == "__main__":
    main()
