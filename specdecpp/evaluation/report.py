"""The report of an evaluation: the summary table, the greedy verdict, `summary.json` and the figures."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from specdecpp.data.io import write_json
from specdecpp.engine.settings import DecodingSettings
from specdecpp.evaluation import plots
from specdecpp.evaluation.arguments import Prompt
from specdecpp.measuring import metrics


def report(records: list[dict], cost: dict, output: str | Path, title: str = "", figures: bool = True,
           settings: dict | None = None, **extra) -> dict:
    """Print the table and greedy verdict, save `summary.json` (and the figures) in `output`; returns the document."""
    summary = metrics.summarize(records, cost["cost_ratio"])
    table = metrics.format_table(summary, cost["cost_ratio"])
    verdict = metrics.greedy_verdict(summary, records)
    save_path = Path(output)
    save_path.mkdir(parents=True, exist_ok=True)
    document = {"title": title, "prompts": len({r["id"] for r in records}), "summary": summary, "table": table,
                "greedy_check": verdict, "cost": cost, **extra, "settings": settings or {}, "machine": machine_info()}
    if figures:
        document["figures"] = [str(plots.plot_pareto(summary, save_path / "pareto.png", title)),
                               str(plots.plot_speedup(summary, save_path / "speedup_vs_threshold.png", title))]
    write_json(save_path / "summary.json", document, indent=1)
    print(table)
    if verdict:
        print(verdict)
    return document


def machine_info() -> dict:
    """Where the timings were taken (they only compare within one run)."""
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def run_title(source: str, prompts: list[Prompt], decoding: DecodingSettings) -> str:
    """What a run measured, in a few words: `humaneval prompts 0-163, greedy, 128 new tokens`."""
    how = f"sampled (temperature {decoding.temperature:g})" if decoding.do_sample else "greedy"
    return f"{source} prompts {prompts[0].id}-{prompts[-1].id}, {how}, {decoding.max_new_tokens} new tokens"
