"""The evaluation's figures; `python -m specdecpp.evaluation.plots results/evaluation/*/summary.json` redraws them."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure  # not pyplot: files only, and no backend chosen for the whole process


def _series(summary: list[dict]) -> dict[str, list[dict]]:
    curves: dict[str, list[dict]] = {}
    for row in summary:
        if row["engine"] is None or row["target_calls_per_token"] is None or row["discarded_per_token"] is None:
            continue
        curves.setdefault(_family(row), []).append(row)
    for rows in curves.values():
        rows.sort(key=lambda r: (r["stop_threshold"] or 0, r["num_assistant_tokens"] or 0,
                                 r.get("assistant_confidence_threshold") or 0))
    return curves


def _family(row: dict) -> str:
    ada_head = f"[{row['method'].split('[')[1].split(']')[0]}]" if "[" in row["method"] else ""
    return f"{row['engine']}:{row['schedule']}{ada_head}"


def _knob_label(row: dict) -> str:
    if row["schedule"] == "ada":
        return f"{row['stop_threshold']:g}"
    if row["schedule"] in ("constant", "heuristic"):
        return f"K={row['num_assistant_tokens']}"
    if row["schedule"] == "dynamic" and "@" in row["method"]:
        return f"{row['assistant_confidence_threshold']:g}"
    return ""


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both coordinates (lower is better), sorted by x."""
    front, best_y = [], float("inf")
    for x, y in sorted(set(points)):
        if y < best_y:
            front.append((x, y))
            best_y = y
    return front


def plot_pareto(summary: list[dict], path: str | Path, title: str = "") -> Path:
    """Save the discarded-tokens vs target-calls figure (PNG) to `path` and return the path."""
    fig = Figure(figsize=(7, 5))
    ax, points = fig.subplots(), []
    for name, rows in _series(summary).items():
        xs = [r["discarded_per_token"] for r in rows]
        ys = [r["target_calls_per_token"] for r in rows]
        points += list(zip(xs, ys))
        hf = rows[0]["engine"] == "hf"
        ax.plot(xs, ys, marker="s" if hf else "o", markerfacecolor="none" if hf else None, markersize=8 if hf else 6,
                linestyle=("--" if hf else "-") if len(rows) > 1 else "none", label=name)
        for row, x, y in zip(rows, xs, ys):
            if label := _knob_label(row):
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if front := pareto_front(points):
        ax.plot(*zip(*front), color="black", linestyle=":", linewidth=1, label="Pareto front")
    return _finish(fig, ax, path, "discarded draft tokens per generated token", "target calls per generated token",
                   title or "Target calls vs discarded tokens (lower-left is better)")


def plot_speedup(summary: list[dict], path: str | Path, title: str = "") -> Path:
    """Save the speedup vs `ada` threshold figure (PNG) to `path` and return the path."""
    fig = Figure(figsize=(7, 5))
    ax = fig.subplots()
    ada_curves: dict[str, list[dict]] = {}
    for row in summary:
        if row["schedule"] == "ada":
            ada_curves.setdefault(_family(row), []).append(row)
    for name, ada in ada_curves.items():
        ada.sort(key=lambda r: r["stop_threshold"])
        ax.plot([r["stop_threshold"] for r in ada], [r["speedup"] for r in ada], marker="o", label=name)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, row in enumerate(_fastest_per_family(summary)):
        ax.axhline(row["speedup"], linestyle="--", linewidth=1, color=colors[(i + len(ada_curves)) % len(colors)],
                   label=f"{row['method']} ({row['speedup']:.2f}x)")
    return _finish(fig, ax, path, "stop threshold (ada)", "speedup over target alone (median over prompts)",
                   title or "Speedup against the stop threshold")


def _fastest_per_family(summary: list[dict]) -> list[dict]:
    """The reference lines: the target alone and the fastest row of every other speculative family."""
    best: dict[str, dict] = {}
    for row in summary:
        if row["schedule"] == "ada" or (row["engine"] is None and row["method"] != "target"):
            continue
        family = "target" if row["engine"] is None else f"{row['engine']}:{row['schedule']}"
        if family not in best or row["speedup"] > best[family]["speedup"]:
            best[family] = row
    return list(best.values())


def _finish(fig, ax, path: str | Path, xlabel: str, ylabel: str, title: str) -> Path:
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def redraw(summary_file: str | Path) -> list[Path]:
    """Draw both figures again from a saved `summary.json`, next to it."""
    summary_file = Path(summary_file)
    document = json.loads(summary_file.read_text(encoding="utf-8"))
    folder, title = summary_file.parent, document.get("title", "")
    return [plot_pareto(document["summary"], folder / "pareto.png", title),
            plot_speedup(document["summary"], folder / "speedup_vs_threshold.png", title)]


def main(argv: list[str] | None = None) -> None:
    """`python -m specdecpp.evaluation.plots SUMMARY_JSON...`: redraw the figures of saved evaluations."""
    for summary_file in sys.argv[1:] if argv is None else argv:
        for path in redraw(summary_file):
            print(path)


if __name__ == "__main__":
    main()
