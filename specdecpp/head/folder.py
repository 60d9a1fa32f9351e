"""A head folder's files besides its weights: the model card (`README.md`, always rendered by `render_card` from
`config.json` and `card_facts`, never edited as text) and `custom_generate/`. Imports no decoding code."""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml
from huggingface_hub import ModelCardData

from specdecpp.checks import read_head_config
from specdecpp.costs import BUSY_SPREAD, FLAT_COST, MEASURED_COST, StepTimes, flat_costs
from specdecpp.head.card_data import LIBRARY_NAME, PAPER_URL, TAGS

SHIM = '''"""SpecDec++ speculative decoding (https://arxiv.org/abs/2405.19715) with the acceptance prediction
head stored in this folder / Hub repo. Needs the `specdecpp` package (see requirements.txt):

    target.generate(**inputs, assistant_model=draft, custom_generate="<this folder or repo>",
                    trust_remote_code=True, max_new_tokens=128)
"""
from specdecpp.custom_generate import generate_from_head


def generate(model, **kwargs):
    """Run SpecDec++ with this folder's head; see `specdecpp.custom_generate.generate_from_head`."""
    return generate_from_head(model, **kwargs)
'''
REQUIREMENTS = "specdecpp\n"
CUSTOM_GENERATE_FILES = {"custom_generate/generate.py": SHIM, "custom_generate/requirements.txt": REQUIREMENTS}

CARD_FACTS = "card.json"
MIXIN_TAGS = ["model_hub_mixin", "pytorch_model_hub_mixin"]
PLACEHOLDER_REPO = "this-repo-or-folder"
REPLAYED_ROUNDS = {"greedy": "greedy rounds", "sampling": "sampled rounds (in expectation over p_acc)"}


def write_head_files(folder: str | os.PathLike, repo_id: str | None = None) -> Path:
    """Write `custom_generate/` and the model card into `folder`; returns the card's path."""
    for name, text in CUSTOM_GENERATE_FILES.items():
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return write_card(folder, repo_id)


def write_card(folder: str | os.PathLike, repo_id: str | None = None) -> Path:
    """Render `folder`'s card (its examples naming `repo_id`) to `README.md`; returns its path."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    readme = folder / "README.md"
    readme.write_text(render_card(config, card_facts(folder), repo_id), encoding="utf-8")
    return readme


def record_card_facts(folder: str | os.PathLike, facts: dict) -> Path:
    """Merge `facts` into `folder`'s `card.json`, keeping its other keys; returns its path."""
    path = Path(folder) / CARD_FACTS
    path.parent.mkdir(parents=True, exist_ok=True)
    recorded = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    path.write_text(json.dumps(recorded | facts, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def card_facts(folder: str | os.PathLike) -> dict:
    """`card.json`'s facts, with `calibration` (from it and `calibration*.json`) and `plots` (the `*.png` files)."""
    folder = Path(folder)
    path = folder / CARD_FACTS
    facts = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    calibration = _named_reports(facts.get("calibration") or {})
    for report in sorted(folder.glob("calibration*.json")):
        calibration[report.stem] = json.loads(report.read_text(encoding="utf-8"))
    return facts | {"calibration": calibration, "plots": sorted(p.name for p in folder.glob("*.png"))}


def _named_reports(calibration: dict) -> dict[str, dict]:
    """`calibration` as one report when it holds figures, else its dict entries by name."""
    if any(_is_figure(value) for value in calibration.values()):
        return {"calibration": calibration}
    return {name: report for name, report in calibration.items() if isinstance(report, dict)}


def _is_figure(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def render_card(config: dict, facts: dict, repo_id: str | None = None) -> str:
    """The model card for `config` and `facts` (`card_facts`), its examples naming `repo_id`."""
    front = ModelCardData(library_name=LIBRARY_NAME, tags=sorted(TAGS + MIXIN_TAGS)).to_yaml()
    sections = [f"---\n{front}\n---", _summary(config, facts), _threshold_section(config),
                _eval_section(facts), _calibration_section(facts), facts.get("notes"), _recipe_section(facts),
                _usage(config, facts, repo_id or PLACEHOLDER_REPO)]
    return "\n\n".join(section for section in sections if section) + "\n"


def _recipe_section(facts: dict) -> str:
    if not facts.get("recipe"):
        return ""
    evaluation, table = facts.get("evaluation") or {}, ""
    if evaluation.get("table"):  # the table's notes below it, apart, or Markdown reads them as rows
        lines = evaluation["table"].splitlines()
        rows = "\n".join(line for line in lines if line.startswith("|"))
        notes = "\n".join(line for line in lines if not line.startswith("|"))
        table = f"\n\nShort evaluation ({evaluation.get('title')}):\n\n{rows}" + (f"\n\n{notes}" if notes else "")
    return f"""## How this head was made

`specdecpp head --recipe recipe.yaml --output DIR` with this recipe (`card.json` holds it too):

```yaml
{yaml.safe_dump(facts["recipe"], sort_keys=False).strip()}
```{table}"""


def _summary(config: dict, facts: dict) -> str:
    reads = (f"the draft's last-layer hidden state (size {config['hidden_size']})" if config["hidden_size"]
             else "no hidden state")
    features = ", ".join(config.get("features") or []) or "none"
    return f"""# Acceptance prediction head (SpecDec++)

Predicts, for a drafted token, the probability that the target model accepts it. SpecDec++ stops
drafting once the predicted probability of at least one rejection exceeds a threshold
([paper]({PAPER_URL})).

- Draft model (the head reads its states): {facts.get("draft") or "not recorded"}
- Target model (whose acceptances it predicts): {facts.get("target") or "not recorded"}
- Training data: {facts.get("training_data") or "not recorded"}
- Head: `{config.get("alignment", "reader")}` alignment, {config["num_layers"]} residual blocks\
{f" {config['width']} wide, the inputs projected to that width" if config.get("width") else ""}; reads {reads}; \
logit features: {features}"""


def _threshold_section(config: dict) -> str:
    threshold = config.get("stop_threshold")
    if threshold is None:
        return ""
    selection = config.get("threshold_selection") or {}
    text = f'## Stop threshold\n\nStored threshold: {threshold:g}; `stop_threshold="auto"` uses it.'
    if not {"thresholds", "cost_per_token", "step_times", "judged_step_times"} <= selection.keys():
        return text
    plain, judged = selection["step_times"], selection["judged_step_times"]
    rivals = "; ".join(f"{name}: " + ", ".join(f"{prefix}{key} {value:.3f}" for key, value in costs.items())
                       for name, prefix, costs in (
                           ("constant K", "K=", selection.get("constant_k_cost_per_token") or {}),
                           ("our dynamic (draft confidence)", "", selection.get("dynamic_cost_per_token") or {}))
                       if costs)
    if selection.get("oracle_cost_per_token") is not None:
        rivals += f"; oracle {selection['oracle_cost_per_token']:.3f}"
    columns = {MEASURED_COST: dict(zip(selection["thresholds"], selection["cost_per_token"]))}
    calls = selection.get("calls_per_token")
    if calls:  # the same replays in the flat view, as the evaluation tables count
        flat = flat_costs(calls, StepTimes(**plain))
        columns[FLAT_COST] = {t: flat[f"ada@{t:g}"] for t in selection["thresholds"] if f"ada@{t:g}" in flat}
    data = f"{selection['data']}, " if selection.get("data") else ""
    processed = "".join(f", {name}={value}" for name, value in (selection.get("processing") or {}).items())
    fitted = " (fitted over lengths, one slow length ignored)" if plain.get("verify_ms_measured") else ""
    busy = [times["spread"] for times in (plain, judged) if times.get("busy")]
    caution = ("\n\n**The machine was busy while these steps were timed**: the timing passes spread by "
               f"{max(busy):.0%} (above {BUSY_SPREAD:.0%}), so these costs, and the threshold chosen with them, are "
               "doubtful. Time again on a quieter machine, or pass `--step_times_from` a head folder whose times are "
               "sound." if busy else "")
    return text + f"""

It was chosen by replaying {REPLAYED_ROUNDS[selection.get('mode', 'greedy')]} on {selection.get('records')} dev
records ({data}{selection.get('tokens')} tokens{processed}) with bound {tuple(selection.get('bound', ()))}, each round priced with
what the loop spends (`specdecpp.costs`), {_priced(plain)}: a target-alone step {plain['target_alone_ms']:.2f} ms; a draft step
{plain['draft_ms'][0]:.2f} ms first in a round, {plain['draft_ms'][-1]:.2f} ms late in a long one ({judged['draft_ms'][0]:.2f} / {judged['draft_ms'][-1]:.2f} ms
with this head judging); the head's judgement {judged['judge_ms']:.3f} ms per drafted token; a verification of 1 / {len(plain['verify_ms']) - 1}
drafted tokens {plain['verify_ms'][1]:.2f} / {plain['verify_ms'][-1]:.2f} ms{fitted}; the loop's own overhead {plain['round_overhead_ms']:.3f} ms per round.
Replayed {MEASURED_COST} (1 / cost is the replayed speedup){": " + rivals if rivals else ""}.
Timings depend on the machine and its load: re-run `--choose_threshold` on the machine you decode on.{caution}

{_table("threshold", columns, "{:.3f}")}"""


def _priced(times: dict) -> str:
    if not times.get("repeats"):
        return f"with given prices ({times['device']}), not timed on this machine"
    processor = f" ({times['processor']})" if times.get("processor") else ""
    return (f"measured through the {times.get('engine', 'eager')} engine's own steps on {times['device']}{processor} "
            f"with {times['threads']} torch thread(s), {times['repeats']} timed passes")


def _calibration_section(facts: dict) -> str:
    tables = {name: {k: round(v, 4) if isinstance(v, float) else v for k, v in report.items() if _is_figure(v)}
              for name, report in _named_reports(facts.get("calibration") or {}).items()}
    calibration = {name: figures for name, figures in tables.items() if figures}
    if not calibration:
        return ""
    names = list(dict.fromkeys(name for figures in calibration.values() for name in figures))
    columns = {name: {report: figures.get(name, "") for report, figures in calibration.items()} for name in names}
    plots = "".join(f"\n\n![{plot}]({plot})" for plot in facts.get("plots") or [])
    return f"## Calibration\n\n{_table('predictions', columns)}{plots}"


def _eval_section(facts: dict) -> str:
    metrics = facts.get("eval_metrics") or {}
    return f"## Eval metrics\n\n{_table('metric', {'value': metrics})}" if metrics else ""


def _table(key: str, columns: dict[str, dict], number: str = "{}") -> str:
    rows = list(dict.fromkeys(row for column in columns.values() for row in column))
    lines = [f"| {key} | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for row in rows:
        cells = [column.get(row, "") for column in columns.values()]
        cells = [number.format(v) if isinstance(v, float) else str(v) for v in cells]
        label = f"{row:g}" if isinstance(row, float) else str(row)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _usage(config: dict, facts: dict, repo_id: str) -> str:
    usage = {}
    if config.get("stop_threshold") is not None:
        selection = config.get("threshold_selection") or {}
        usage["stop_threshold"] = '"auto"'
        if selection.get("bound"):
            usage["bound"] = tuple(selection["bound"])
        if selection.get("mode") == "sampling":
            usage["do_sample"] = True
    settings = "".join(f", {name}={value}" for name, value in usage.items())
    target, draft = facts.get("target") or "TARGET", facts.get("draft") or "DRAFT"
    return f"""## Use from transformers

This repository carries `custom_generate/generate.py`, so `generate` runs SpecDec++ with this head
(with the `specdecpp` package installed; `trust_remote_code=True` runs that file):

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
target = AutoModelForCausalLM.from_pretrained("{target}")
draft = AutoModelForCausalLM.from_pretrained("{draft}")
tokenizer = AutoTokenizer.from_pretrained("{target}")
inputs = tokenizer("def fibonacci(n):", return_tensors="pt")
out = target.generate(**inputs, assistant_model=draft, custom_generate="{repo_id}",
                      trust_remote_code=True, max_new_tokens=128{settings})
print(tokenizer.decode(out[0]))
```

## Use

With specdecpp directly:

```python
from specdecpp import AcceptancePredictionHead, speculative_generate
head = AcceptancePredictionHead.from_pretrained("{repo_id}")
out = speculative_generate(target, draft, **inputs, head=head{settings})
```"""


def stored_step_times(path: str) -> tuple[StepTimes, StepTimes]:
    """The `(plain, judged)` step times a threshold choice stored in a head folder or JSON file."""
    if os.path.isdir(path):
        selection = read_head_config(path).get("threshold_selection") or {}
    else:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        selection = data.get("threshold", data)
    if "judged_step_times" not in selection:
        raise ValueError(f"{path} stores no step times: choose a head's threshold there first (--choose_threshold)")
    return StepTimes(**selection["step_times"]), StepTimes(**selection["judged_step_times"])
