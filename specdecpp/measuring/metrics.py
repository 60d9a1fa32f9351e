"""The figures an evaluation reports (docs/design.md, Measuring), its table and its greedy verdict."""
from __future__ import annotations

import statistics

from specdecpp.costs import FLAT_COST, FLAT_UNIT, cost_per_token, flat_spent

IDENTITY_FIELDS = ("method", "engine", "schedule", "num_assistant_tokens", "stop_threshold", "head",
                   "assistant_confidence_threshold")


def summarize(records: list[dict], cost_ratio: float) -> list[dict]:
    """One summary row per method, in order of first appearance; a count a method lacks is None."""
    methods: dict[str, list[dict]] = {}
    for record in records:
        methods.setdefault(record["method"], []).append(record)
    return [_summarize_method(rows, cost_ratio) for rows in methods.values()]


def _summarize_method(rows: list[dict], cost_ratio: float) -> dict:
    tokens = sum(r["generated_length"] for r in rows)
    target_calls, draft_calls, discarded = (_total(rows, name) for name in ("num_LM_call", "draft_calls",
                                                                           "num_mismatched_tokens"))
    accepted = [a for r in rows for a in (r["accepted_lengths"] or [])]
    checked = [r["matches_target"] for r in rows if r["matches_target"] is not None]
    row = {name: rows[0].get(name) for name in IDENTITY_FIELDS}  # records of older runs lack the newer fields
    return row | {
        "prompts": len(rows),
        "generated_tokens": tokens,
        "tokens_per_s": statistics.median(r["generated_length"] / r["spec_time"] for r in rows),
        "speedup": statistics.median(r["target_time"] / r["spec_time"] for r in rows),
        "median_time_s": statistics.median(r["spec_time"] for r in rows),
        "mean_accepted_length": statistics.fmean(accepted) if accepted else None,
        "target_calls_per_token": _per_token(target_calls, tokens),
        "draft_calls_per_token": _per_token(draft_calls, tokens),
        "discarded_per_token": _per_token(discarded, tokens),
        "cost_per_token": (cost_per_token(flat_spent(target_calls, draft_calls, cost_ratio), tokens)
                           if target_calls is not None and draft_calls is not None else None),
        "greedy_identical": sum(checked) if checked else None,
        "greedy_checked": len(checked) if checked else None,
    }


def _total(rows: list[dict], name: str) -> int | None:
    values = [r[name] for r in rows]
    return None if any(v is None for v in values) else sum(values)


def _per_token(count: int | None, tokens: int) -> float | None:
    return None if count is None or tokens == 0 else count / tokens


NEAR_TIE_MARGIN = 1e-2  # top-two logit gap below which a greedy difference is a numerical near-tie


def greedy_verdict(summary: list[dict], records: list[dict] | None = None) -> str | None:
    """One sentence on the greedy check (None when nothing was checked); near-tie differences are no failure."""
    checked = [row for row in summary if row["greedy_checked"]]
    if not checked:
        return None
    ties: dict[str, list[str]] = {}
    for r in records or []:
        margin = r.get("first_difference_margin")  # records of older runs lack it
        if r.get("matches_target") is False and margin is not None and margin < NEAR_TIE_MARGIN:
            ties.setdefault(r["method"], []).append(f"prompt {r['id']} differs at a near-tie (margin {margin:.2g})")
    failed = [f"{row['method']} ({row['greedy_identical'] + len(ties.get(row['method'], []))}/{row['greedy_checked']})"
              for row in checked
              if row["greedy_identical"] + len(ties.get(row["method"], [])) < row["greedy_checked"]]
    near = "; ".join(f"{method}: {', '.join(found)}" for method, found in ties.items())
    if not failed and not near:
        return (f"greedy check passed: the output of every method ({len(checked)}) equals the target's, "
                f"prompt by prompt ({checked[0]['greedy_checked']} prompts)")
    if not failed:
        return (f"greedy check passed up to near-ties: every method ({len(checked)}) reproduces the target's output "
                f"on every prompt ({checked[0]['greedy_checked']} prompts) except where the target's top two logits "
                f"are less than {NEAR_TIE_MARGIN:g} apart: {near}")
    verdict = "greedy check FAILED, outputs differ from the target's: " + ", ".join(failed)
    return verdict + (f" (apart from near-ties, top-two logit margin < {NEAR_TIE_MARGIN:g}: {near})" if near else "")


COLUMNS = (  # (header, summary key, format)
    ("method", "method", "{}"),
    ("tok/s", "tokens_per_s", "{:.1f}"),
    ("speedup", "speedup", "{:.2f}x"),
    ("acc.len", "mean_accepted_length", "{:.2f}"),
    ("target/tok", "target_calls_per_token", "{:.3f}"),
    ("draft/tok", "draft_calls_per_token", "{:.3f}"),
    ("discard/tok", "discarded_per_token", "{:.3f}"),
    (FLAT_COST, "cost_per_token", "{:.3f}"),
    ("= target", "greedy_identical", None),
)


def format_table(summary: list[dict], cost_ratio: float | None = None) -> str:
    """The summary as a fixed-width table, one line per method, `-` for a figure a method lacks."""
    cells = [[header for header, _, _ in COLUMNS]] + [[_cell(row, key, fmt) for _, key, fmt in COLUMNS]
                                                      for row in summary]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
             + " |" for line in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 1) + ("-" if i == 0 else ":") for i, w in enumerate(widths)) + "|")
    if cost_ratio is not None:
        lines.append(f"{FLAT_COST}: {FLAT_UNIT}; c = {cost_ratio:.3f}, measured in this run")
    return "\n".join(lines)


def _cell(row: dict, key: str, fmt: str | None) -> str:
    if key == "greedy_identical":
        return "-" if row["greedy_checked"] is None else f"{row['greedy_identical']}/{row['greedy_checked']}"
    value = row[key]
    return "-" if value is None else fmt.format(value)
