"""`auto`'s threshold for the zoo head chosen again at this machine's step times, both engines, beside the stored
choice: the stored replayed rounds priced at the head's stored step times and at the ones measured here.

    python results/cpu-per-machine/rechoose.py   # one torch thread, nothing else running
"""
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from harness import HEAD, load_pair  # noqa: E402

from specdecpp.costs import StepTimes  # noqa: E402
from specdecpp.measuring.step_timing import device_step_times  # noqa: E402

torch.set_num_threads(1)
target, draft, head = load_pair(head=HEAD)
selection = head.threshold_selection
stored = StepTimes(**{key: value for key, value in selection["judged_step_times"].items()
                      if key in StepTimes.__dataclass_fields__})


def costs(times: StepTimes) -> list[float]:
    return [times.rounds_ms(weights, judged=True) / times.target_alone_ms / selection["tokens"]
            for weights in selection["round_weights"]]


def describe(name: str, times: StepTimes) -> None:
    row = costs(times)
    print(f"{name}: first draft step {times.draft_ms[0]:.3f} ms, verify 1..4 {[round(v, 3) for v in times.verify_ms[1:5]]} ms, "
          f"target alone {times.target_alone_ms:.3f} ms; c = {times.cost_ratio():.3f}; threshold "
          f"{head.threshold_for(times)}; target-alone steps per token by threshold: "
          + ", ".join(f"{t:g} {c:.4f}" for t, c in zip(selection["thresholds"], row)))


describe(f"stored ({selection['judged_step_times'].get('device')}, {selection['judged_step_times'].get('engine')})",
         stored)
with tempfile.TemporaryDirectory() as cache:
    for compile in (False, True):
        describe(f"here ({'compiled' if compile else 'eager'})",
                 device_step_times(target, draft, head, compile=compile, cache_dir=Path(cache)))
