"""Print the README's compact results table for saved evaluations, from their `summary.json`.

    python benchmarks/results_tables.py results/evaluation/humaneval/summary.json [more summary.json ...]
    python benchmarks/results_tables.py --pool --cost_ratio 0.2 results/sampled/humaneval-seed{0,1,2}/summary.json

`--pool` reads runs of the same methods on the same prompts with different sampling seeds as one:
counts summed over the runs (cost per token at the runs' mean `c`, or at `--cost_ratio`), speedup
the median of the runs' median speedups.

Per run: the baselines (the target alone, Hugging Face's dynamic), the lowest-cost member of each
of our schedule families (constant K, dynamic, ada with each head), `ada` at `auto`, the oracle,
and the figures the SpecDec++ goals are stated in: `ada@auto` against the best constant K, the best
dynamic, Hugging Face's dynamic and the reference-aligned head, `auto` against the best grid
threshold, and in wall clock against the fastest member of each family. The full tables are the runs' own `table` (`summary.json`).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from specdecpp.costs import FLAT_COST

COLUMNS = ("method", "speedup", "mean_accepted_length", "target_calls_per_token", "discarded_per_token",
           "cost_per_token")


def family(row: dict) -> str:
    """A method's family: its name up to the knob (`specdecpp:ada[head]`, `specdecpp:constant`)."""
    return row["method"].split("@")[0]


def best_rows(summary: list[dict]) -> dict[str, dict]:
    """The lowest-cost row of each family (ada's `auto` rows stay out of their family's choice)."""
    best: dict[str, dict] = {}
    for row in summary:
        if row["cost_per_token"] is None or row["method"].endswith("@auto"):
            continue
        name = family(row)
        if name not in best or row["cost_per_token"] < best[name]["cost_per_token"]:
            best[name] = row
    return best


def compact_table(document: dict) -> str:
    """The compact Markdown table of one run: baselines, best per family, `auto`, oracle."""
    summary = document["summary"]
    best = best_rows(summary)
    rows = [r for r in summary if r["method"] in ("target", "hf:dynamic")]
    rows += [best[name] for name in best if name.startswith("specdecpp:") and "oracle" not in name]
    rows += [r for r in summary if r["method"].endswith("@auto")]
    rows += [r for r in summary if r["schedule"] == "oracle"]
    lines = [f"| method | speedup | mean accepted | target calls/token | discarded/token | {FLAT_COST} |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(rows, key=lambda r: rows.index(r)):
        cells = [r["method"], f"{r['speedup']:.2f}x",
                 "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}",
                 f"{r['target_calls_per_token']:.3f}", f"{r['discarded_per_token']:.3f}", f"{r['cost_per_token']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(document: dict) -> str:
    """`ada` with the first head at `auto` against the rivals the goals name (the best constant K,
    dynamic and vLLM's online estimator, Hugging Face's dynamic, other heads): its change in cost
    per token, in percent (negative: cheaper)."""
    summary = document["summary"]
    best = best_rows(summary)
    auto = [r for r in summary if r["method"].endswith("@auto")]
    if not auto:
        return ""
    auto = auto[0]
    ada_family = family(auto)

    def less(other: dict) -> str:
        return f"{100 * (auto['cost_per_token'] / other['cost_per_token'] - 1):+.1f}% vs {other['method']} " \
               f"({other['cost_per_token']:.3f})"

    rivals = [best.get("specdecpp:constant"), best.get("specdecpp:dynamic"), best.get("specdecpp:online"),
              next((r for r in summary if r["method"] == "hf:dynamic"), None)]
    rivals += [row for name, row in best.items() if name.startswith("specdecpp:ada") and name != ada_family]
    parts = [less(r) for r in rivals if r is not None]
    grid = best.get(ada_family)
    if grid is not None:
        parts.append(f"{100 * (auto['cost_per_token'] / grid['cost_per_token'] - 1):+.1f}% vs the best grid "
                     f"threshold, {grid['method']} ({grid['cost_per_token']:.3f})")
    return f"{auto['method']} (threshold {auto['stop_threshold']:g}, cost {auto['cost_per_token']:.3f}): " + \
        "; ".join(parts)


def clock(document: dict) -> str:
    """Wall clock: `ada` at `auto` against the fastest member (highest median speedup) of each of
    our other families and Hugging Face's dynamic."""
    summary = document["summary"]
    auto = next((r for r in summary if r["method"].endswith("@auto")), None)
    if auto is None:
        return ""
    fastest: dict[str, dict] = {}
    for row in summary:
        name = family(row)
        if row["method"] != "target" and not row["method"].endswith("@auto") and "oracle" not in name and (
                name not in fastest or row["speedup"] > fastest[name]["speedup"]):
            fastest[name] = row
    rivals = ", ".join(f"{row['method']} {row['speedup']:.2f}x" for row in fastest.values())
    return f"wall clock: {auto['method']} {auto['speedup']:.2f}x; the fastest of each family: {rivals}"


def pooled(documents: list[dict], cost_ratio: float | None = None) -> dict:
    """One document from runs of the same methods with different seeds: per method, tokens and
    calls summed over the runs, cost per token `(target calls + c draft calls) / token` at
    `cost_ratio` (default: the runs' mean `c`), mean accepted length weighted by rounds, speedup
    the median of the runs'. ValueError when the runs hold different methods."""
    methods = [[row["method"] for row in document["summary"]] for document in documents]
    if any(m != methods[0] for m in methods):
        raise ValueError("the runs to pool must hold the same methods in the same order")
    c = statistics.fmean(d["cost"]["cost_ratio"] for d in documents) if cost_ratio is None else cost_ratio
    summary = []
    for rows in zip(*(document["summary"] for document in documents)):
        tokens = sum(r["generated_tokens"] for r in rows)
        calls = {key: sum(r[key] * r["generated_tokens"] for r in rows) / tokens
                 for key in ("target_calls_per_token", "draft_calls_per_token", "discarded_per_token")}
        rounds = [r["target_calls_per_token"] * r["generated_tokens"] for r in rows]
        accepted = None if rows[0]["mean_accepted_length"] is None else \
            sum(r["mean_accepted_length"] * n for r, n in zip(rows, rounds)) / sum(rounds)
        summary.append({**rows[0], **calls, "generated_tokens": tokens, "mean_accepted_length": accepted,
                        "speedup": statistics.median(r["speedup"] for r in rows),
                        "cost_per_token": calls["target_calls_per_token"] + c * calls["draft_calls_per_token"]})
    seeds = ", ".join(str(d["settings"].get("seed", d["settings"].get("random_seed"))) for d in documents)
    runs = f"{len(documents)} seeds ({seeds}) pooled" if len(documents) > 1 else f"seed {seeds}"
    return {**documents[0], "title": f"{documents[0]['title']}, {runs}",
            "summary": summary, "cost": {**documents[0]["cost"], "cost_ratio": c}}


def main(argv: list[str] | None = None) -> None:
    """Print each run's title, cost ratio, greedy verdict, compact table and goal figures (with
    `--pool`, those of the runs pooled into one)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("summaries", nargs="+", help="summary.json files of evaluate runs")
    parser.add_argument("--pool", action="store_true", help="pool the runs (seeds of one evaluation) into one")
    parser.add_argument("--cost_ratio", type=float, default=None, help="c for pooled costs (default: the runs' mean)")
    args = parser.parse_args(argv)
    documents = [json.loads(Path(path).read_text(encoding="utf-8")) for path in args.summaries]
    if args.pool:
        documents = [pooled(documents, args.cost_ratio)]
    print(tables(documents))


def tables(documents: list[dict]) -> str:
    """Each run's title, cost ratio, greedy verdict, compact table and goal figures, as Markdown."""
    return "\n".join(f"## {document['title']} ({document['prompts']} prompts, c = {document['cost']['cost_ratio']:.3f})\n"
                     f"{document.get('greedy_check') or 'sampled: no greedy check'}\n{compact_table(document)}\n"
                     f"{goals(document)}\n{clock(document)}\n" for document in documents)


if __name__ == "__main__":
    main()
