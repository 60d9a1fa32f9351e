"""Compiled rounds of 2 drafted tokens on one context (a 256-token engine), the verification timed round by round
after something else ran: nothing; the context read again (eagerly, as a generation reads its prompt); sleeping 30 ms;
a Python busy loop of 30 ms; 40 draft steps; 10 target-alone steps; sleeping 30 ms then 5 target-alone steps;
sleeping 30 ms then reading every target weight and cache tensor once. Medians over 10 repetitions.

    python results/verify-steps/excess/after_a_pause.py
"""
import statistics
import time
from collections import defaultdict

import torch
from zoo import continued, round_ms, zoo

from specdecpp.engine.decoding import step_models, verify
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.settings import DecodingSettings
from specdecpp.measuring.step_timing import loaded_models

target, draft, head, prompts = zoo(0, 6)
context = continued(target, prompts[3], 64)
seq, processing = context[0].tolist(), sampling_only(False)
target_model, draft_model = loaded_models(
    lambda: step_models(target, draft, DecodingSettings(compile=True), processing, 256)[:2], seq)
ROUNDS, SHOWN = 24, (1, 2, 3, 4, 6, 8, 12, 16, 24)


def read_context() -> None:
    target_model.crop(0)
    draft_model.crop(0)
    target_model.logits(seq, num_logits=1)
    draft_model.draft_step(seq, 1, None)
    target_model.crop(len(seq) - 1)
    draft_model.crop(len(seq) - 1)


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def target_alone(n: int) -> None:
    for _ in range(n):
        verify(target_model, seq, [], [], processing, None)
        target_model.crop(len(seq) - 1)


def draft_steps(n: int) -> None:
    for _ in range(n):
        draft_model.draft_step(seq, 1, None)
        draft_model.crop(len(seq) - 1)


def read_target_memory() -> None:
    for tensor in [*target.parameters(), *(t for layer in target_model.cache.layers for t in (layer.keys, layer.values))]:
        tensor.sum()


before = {
    "nothing": lambda: None,
    "the context read again": read_context,
    "sleeping 30 ms": lambda: time.sleep(0.03),
    "a Python busy loop of 30 ms": lambda: busy(0.03),
    "40 draft steps": lambda: draft_steps(40),
    "10 target-alone steps": lambda: target_alone(10),
    "sleeping 30 ms, then 5 target-alone steps": lambda: (time.sleep(0.03), target_alone(5)),
    "sleeping 30 ms, then every target tensor read": lambda: (time.sleep(0.03), read_target_memory()),
}
curves = defaultdict(list)
with torch.inference_mode():
    for _ in range(30):
        round_ms(target_model, draft_model, seq, 2)
    for _ in range(10):
        for name, disturb in before.items():
            for _ in range(ROUNDS):
                round_ms(target_model, draft_model, seq, 2)
            disturb()
            curves[name].append([round_ms(target_model, draft_model, seq, 2) for _ in range(ROUNDS)])
print("verifying 2 drafted tokens, ms, by round after it (median of 10)")
print("| after | " + " | ".join(f"round {r}" for r in SHOWN) + " |")
print("| --- |" + " ---: |" * len(SHOWN))
for name, runs in curves.items():
    print(f"| {name} | " + " | ".join(f"{statistics.median(run[r - 1] for run in runs):.2f}" for r in SHOWN) + " |")
