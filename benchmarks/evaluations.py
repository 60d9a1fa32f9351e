"""The zoo pair's evaluations that `results/evaluation` and `results/sampled` hold: one `specdecpp evaluate`
run per prompt set (and sampling seed), then their compact tables (`results_tables.py`) in OUT/TABLES.md.

    python benchmarks/evaluations.py greedy --out results/evaluation    # HumanEval and held-out stdlib, compiled
    python benchmarks/evaluations.py sampled --out results/sampled      # the sampling head, temperature 1, compiled
    python benchmarks/evaluations.py greedy --out /tmp/e --quick        # 2 prompts, 8 tokens, eager, K=2, @0.4

Any other flag goes to every evaluation (`--resume` continues interrupted ones).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from harness import DRAFT, TARGET, ZOO
from results_tables import pooled, tables

COMMON = ["--target", TARGET, "--draft", DRAFT, "--torch_dtype", "float32", "--threads", "1", "--bound", "1", "20",
          "--stop_threshold", "auto", "--baselines", "target", "hf:dynamic"]
GREEDY = [*COMMON, "--head", str(ZOO / "head"), "--schedule", "constant", "dynamic", "ada", "oracle",
          "--num_assistant_tokens", "2", "3", "4", "5", "--assistant_confidence_threshold", "0.3", "0.4", "0.5", "0.6"]
SAMPLED = [*COMMON, "--head", str(ZOO / "head-sampling"), "--schedule", "constant", "dynamic", "ada",
           "--num_assistant_tokens", "1", "2", "3", "--assistant_confidence_threshold", "0.5", "0.6", "0.7",
           "--do_sample", "--temperature", "1", "--top_k", "0", "--top_p", "1", "--no_plots"]
# Each set: its runs (folder: flags) and the groups its tables show, each group's runs pooled at c = POOLED_C
# (the sampled seeds), or each run on its own at its measured c (None).
SETS = {
    "greedy": ({"humaneval": [*GREEDY, "--prompts", "humaneval"],
                "stdlib-heldout": [*GREEDY, "--prompts", "stdlib-heldout", "--n_end", "214"]}, None),
    "sampled": ({**{f"humaneval-seed{seed}": [*SAMPLED, "--prompts", "humaneval", "--seed", str(seed)]
                    for seed in range(3)},
                 "stdlib-heldout-seed0": [*SAMPLED, "--prompts", "stdlib-heldout", "--n_end", "160", "--seed", "0"]},
                [["humaneval-seed0", "humaneval-seed1", "humaneval-seed2"], ["stdlib-heldout-seed0"]]),
}
POOLED_C = 0.2
QUICK = ["--n_end", "2", "--max_new_tokens", "8", "--no_plots", "--num_assistant_tokens", "2", "--assistant_confidence_threshold", "0.4"]


def run(name: str, out: Path, quick: bool = False, extra: list[str] = ()) -> str:
    """Run the evaluations of set `name` into `out`/<run>, write their tables to `out`/TABLES.md and return them.
    `quick`: eager, 2 prompts of 8 tokens each (that every run works, not what it measures)."""
    runs, groups = SETS[name]
    for folder, flags in runs.items():  # each as `specdecpp evaluate` runs: a process of its own
        subprocess.run([sys.executable, "-m", "specdecpp.evaluate", *flags, *(QUICK if quick else ["--compile"]),
                        *extra, "--output", str(out / folder)], check=True)
    summaries = {folder: json.loads((out / folder / "summary.json").read_text(encoding="utf-8")) for folder in runs}
    documents = list(summaries.values()) if groups is None else \
        [pooled([summaries[folder] for folder in group], POOLED_C) for group in groups]
    text = tables(documents)
    (out / "TABLES.md").write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("set", choices=sorted(SETS), help="which evaluations")
    parser.add_argument("--out", required=True, help="folder for the runs and TABLES.md")
    parser.add_argument("--quick", action="store_true", help="2 prompts, 8 tokens, eager: that every run works")
    args, extra = parser.parse_known_args(argv)
    text = run(args.set, Path(args.out), args.quick, extra)
    print(text)
    return text


if __name__ == "__main__":
    main()
