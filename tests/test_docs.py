"""The documents against what they describe, so that they cannot drift: the README's facts about
the shipped heads against the heads' `card.json` and `config.json`, the signature it shows for
`speculative_generate` against the function's, every link of the README and of the results' pages
against the files and headings it points to, every benchmark command they give and every flag
docs/design.md names for a script against that script's `--help`, and results/ against what the
README cites."""
from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import os
import re
import runpy
import sys
from functools import cache
from pathlib import Path

import pytest

from specdecpp import speculative_generate
from specdecpp.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "checkpoints" / "zoo"
README = (ROOT / "README.md").read_text(encoding="utf-8")
DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
HEAD_PATH = re.compile(r"`checkpoints/zoo/(head[\w-]*)`")
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


# -- the README's facts about the shipped heads ----------------------------------------------------

def shipped_heads() -> list[str]:
    return sorted(path.parent.name for path in ZOO.glob("head*/config.json"))


def head_files(name: str) -> tuple[dict, dict]:
    """(config.json, card.json) of the shipped head `name`."""
    return tuple(json.loads((ZOO / name / file).read_text(encoding="utf-8")) for file in ("config.json", "card.json"))


def values_of(tree, key: str) -> list:
    """Every value stored under `key` anywhere in the JSON `tree`."""
    if isinstance(tree, dict):
        return [v for k, v in tree.items() if k == key] + [x for v in tree.values() for x in values_of(v, key)]
    if isinstance(tree, list):
        return [x for v in tree for x in values_of(v, key)]
    return []


def section(text: str, title: str) -> str:
    """The text of the markdown section `## title`, up to the next `## `."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def table_rows(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in `text` whose first header is `first_header`, each as
    {header: cell}."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"\|\s*{re.escape(first_header)}\s*\|", line))

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    header = cells(lines[start])
    rows = []
    for line in lines[start + 2:]:  # past the header and its --- row
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, cells(line))))
    return rows


def stated_facts(name: str) -> dict[str, str]:
    """What a shipped head's card and config say, in the words of the README's table of heads."""
    config, card = head_files(name)
    reads = (["hidden state"] if config["hidden_size"] else []) + [f.replace("_", " ") for f in config.get("features", [])]
    selection = config.get("threshold_selection", {})
    mode = selection.get("mode") or card["data"]["mode"].split()[0]
    temperature = re.search(r"temperature ([\d.]+)", card["data"]["mode"])
    records = f"{card['data']['train']['records']:,} " + ("sampled" if mode.startswith("sampling") else "greedy")
    threshold = (f"{config['stop_threshold']} for bound ({selection['bound'][0]}, {selection['bound'][1]})"
                 if config.get("stop_threshold") is not None else "none")
    return {"alignment": config.get("alignment", "reader"), "reads": ", ".join(reads),
            "training records": records + (f" (temperature {temperature.group(1)})" if temperature else ""),
            "dev AUROC": sorted({f"{auroc:.3f}" for auroc in values_of(card["calibration"], "auroc")}),
            "stored threshold": threshold}


def test_the_readme_table_of_heads_is_their_cards_and_configs():
    rows = table_rows(section(README, "Results on the embedded pair"), "head")
    named = [HEAD_PATH.fullmatch(row["head"]).group(1) for row in rows]
    assert sorted(named) == shipped_heads(), "the table lists every shipped head, and only those"
    for name, row in zip(named, rows):
        facts = stated_facts(name)
        aurocs = facts.pop("dev AUROC")
        assert {key: row[key] for key in facts} == facts, name
        assert row["dev AUROC"] in aurocs, (name, aurocs)


def test_the_readme_shows_speculative_generate_s_signature():
    shown = re.search(r"`(speculative_generate\(target, draft, input_ids, \*,.*?\))` —", README, re.DOTALL)
    assert shown, "the README shows speculative_generate's signature"
    signature = inspect.signature(speculative_generate)
    bare = signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                             return_annotation=signature.empty)
    assert re.sub(r"\s+", " ", shown.group(1)) == f"speculative_generate{bare}"


# -- docs/design.md's flags ------------------------------------------------------------------------

# A command module by its own name (`recipe`) or its command's (`calibration`, `build_data`); `head`
# names the head, not the recipe command, in prose.
MODULES = {module.rpartition(".")[2]: module for module, _ in COMMANDS.values()} \
    | {name.replace("-", "_"): module for name, (module, _) in COMMANDS.items() if name != "head"}


def script_of(span: str) -> str | None:
    """The script a backticked span of docs/design.md names, as a module or a file under the
    repository: `specdecpp <command> ...`, `<command module> ...` (`calibration --threads`) or
    `[python ]benchmarks/<name>.py`; None for any other span."""
    words = span.split()
    if words[:1] == ["python"]:
        words = words[1:]  # `python benchmarks/<name>.py ...` names the script
    if not words:
        return None
    if words[0] == "specdecpp" and len(words) > 1 and words[1].replace("_", "-") in COMMANDS:
        return COMMANDS[words[1].replace("_", "-")][0]
    if re.fullmatch(r"benchmarks/\w+\.py", words[0]):
        return words[0]
    return MODULES.get(words[0])


def design_flags(text: str) -> dict[str, set[str]]:
    """{flag: the scripts docs/design.md names it for}. A flag belongs to the script in its own
    backticked span (`calibration --threads`) or else to every script its clause (a sentence, or
    a part of one between semicolons) names; a flag whose clause names none maps to an empty set,
    unless another clause names it with one."""
    flags: dict[str, set[str]] = {}
    for sentence in re.split(r"\.\s+(?=[A-Z`(])|;\s|\n\s*\n|\n\s*- ", text):
        spans = re.findall(r"`([^`]+)`", sentence)
        named = {script for span in spans if (script := script_of(span))}
        for span in spans:
            own = script_of(span)
            for flag in FLAG.findall(span):
                flags.setdefault(flag, set()).update({own} if own else named)
    return flags


def test_design_flags_are_read_per_script():
    text = ("`build_data` and `evaluate` take `--repetition_penalty`: more. `calibration --threads` sets "
            "threads, as in `demo`. The timing says so (`--step_times_from`).\n\n`benchmarks/time_breakdown.py` "
            "takes `--engine compiled`; `specdecpp head` passes it on.")
    assert design_flags(text) == {"--repetition_penalty": {"specdecpp.data.build_data", "specdecpp.evaluate"},
                                  "--threads": {"specdecpp.calibration.report"}, "--step_times_from": set(),
                                  "--engine": {"benchmarks/time_breakdown.py"}}


@cache
def help_flags(script: str) -> frozenset[str]:
    """The flags `script --help` lists (a command module's `main` or a benchmark file, run in this
    process)."""
    argv = ["build", "--help"] if script == "specdecpp.training.zoo" else ["--help"]  # zoo's flags are its build's
    shown, saved_argv, saved_path, saved_environ = io.StringIO(), sys.argv, sys.path, dict(os.environ)
    try:
        with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
            if script.endswith(".py"):
                # as `python benchmarks/x.py` runs it: its folder first on sys.path (for its siblings)
                sys.argv, sys.path = [str(ROOT / script), *argv], [str((ROOT / script).parent), *saved_path]
                runpy.run_path(str(ROOT / script), run_name="__main__")
            else:
                importlib.import_module(script).main(argv)
    finally:
        sys.argv, sys.path = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(saved_environ)  # a benchmark may set its threads' variables when it loads
    return frozenset(FLAG.findall(shown.getvalue()))


def test_every_flag_docs_design_names_is_in_its_scripts_help():
    flags = design_flags(DESIGN)
    assert "--compile" in flags and "--engine" in flags  # the reading still finds flags with their scripts
    for flag, scripts in sorted(flags.items()):
        assert scripts, f"docs/design.md names {flag} without the script that takes it (write `script {flag}`)"
        for script in sorted(scripts):
            assert flag in help_flags(script), f"docs/design.md names {flag} for {script}, whose --help lacks it"


# -- the README's links and benchmark commands, and results/ -----------------------------------------

RESULTS = ROOT / "results"
PAGES = [ROOT / "README.md", RESULTS / "README.md", ROOT / "benchmarks" / "README.md",
         *sorted(RESULTS.glob("*/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
BENCHMARK_COMMAND = re.compile(r"python (benchmarks/\w+\.py)((?:\\\n|[^\n`|])*)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page."""
    titles = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


def test_every_link_of_the_readme_and_the_results_pages_resolves():
    checked = 0
    for page in PAGES:
        for link in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", link):
                continue  # a web address
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            assert target.exists(), f"{page.relative_to(ROOT)} links {link}, which does not exist"
            assert not anchor or anchor in anchors(target), f"{page.relative_to(ROOT)} links {link}: no such heading"
            checked += 1
    assert checked >= len(PAGES)


def benchmark_commands(text: str) -> list[tuple[str, set[str]]]:
    """`(script, flags)` of every `python benchmarks/<name>.py ...` command in `text`, lines continued by `\\`."""
    return [(script, set(FLAG.findall(rest))) for script, rest in BENCHMARK_COMMAND.findall(text)]


def test_benchmark_commands_are_read_with_their_continued_lines():
    text = "    python benchmarks/a.py --x 1 \\\n      --y 2 | tee out\n`python benchmarks/b.py --z` and --w"
    assert benchmark_commands(text) == [("benchmarks/a.py", {"--x", "--y"}), ("benchmarks/b.py", {"--z"})]


def test_every_benchmark_command_of_the_readme_and_the_results_pages_takes_its_flags():
    commands = [command for page in PAGES for command in benchmark_commands(page.read_text(encoding="utf-8"))]
    assert {script for script, _ in commands} >= {"benchmarks/time_breakdown.py", "benchmarks/evaluations.py"}
    for script, flags in commands:
        assert (ROOT / script).is_file(), script
        assert flags <= help_flags(script), (script, flags - help_flags(script))


def test_results_hold_what_the_readme_cites_each_remade_by_one_benchmark_command():
    """At most 10 folders, each linked from the README, each with a README giving one `benchmarks/`
    command that writes into it; summaries only: no scripts, no file over 1 MB."""
    folders = sorted(path for path in RESULTS.iterdir() if path.is_dir())
    assert 0 < len(folders) <= 10
    cited = {match.split("/")[1] for match in re.findall(r"\]\((results/[\w.-]+)/", README)}
    assert cited == {folder.name for folder in folders}, "the README links every results folder, and only those"
    for folder in folders:
        page = (folder / "README.md").read_text(encoding="utf-8")
        assert len({script for script, _ in benchmark_commands(page)}) == 1, folder.name
        assert f"results/{folder.name}" in page, f"{folder.name}'s command writes elsewhere"
    tracked = [path for path in RESULTS.rglob("*") if path.is_file() and not re.fullmatch(r"results_.*\.json", path.name)]
    assert not [path for path in tracked if path.suffix in (".py", ".sh", ".diff", ".ipynb")], "no scripts in results/"
    assert not [path for path in tracked if path.stat().st_size > 1_000_000], "no file over 1 MB in results/"
