"""The package's layout: the import contracts in pyproject.toml hold and cover every module, no
module imports one that imports it back, and docs/design.md names every module."""
from __future__ import annotations

import re
from pathlib import Path

import grimp
from importlinter import configuration
from importlinter.application.use_cases import lint_imports

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specdecpp"


def modules() -> set[str]:
    """The package's modules, a package's `__init__` left out."""
    return {".".join(path.relative_to(ROOT).with_suffix("").parts) for path in PACKAGE.rglob("*.py")
            if path.name != "__init__.py"}


def test_the_import_contracts_are_kept():
    configuration.configure()
    assert lint_imports(str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True), "lint-imports names the broken one"


def test_every_module_is_on_a_layer():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    layers = next(c["layers"] for c in config["contracts"] if c["type"] == "layers")
    listed = {name for layer in layers for name in re.split(r"[|:]", layer) if name.strip().startswith("specdecpp.")}
    assert {name.strip() for name in listed} == modules()


def test_no_import_cycle():
    """Imports inside functions count too: a module that needs another back when called is still a cycle."""
    graph = grimp.build_graph("specdecpp", cache_dir=None)
    cycles = [(importer, imported) for importer in graph.modules
              for imported in graph.find_modules_directly_imported_by(importer)
              if imported.startswith("specdecpp.") and not importer.startswith(imported + ".")
              and graph.chain_exists(imported=importer, importer=imported)]
    assert not cycles, cycles


def test_the_design_names_every_module_once():
    """docs/design.md's table "Which module owns what" lists each module of the package once, and
    nothing else."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index("## Which module owns what")
    end = text.find("\n## ", start)
    table = text[start:end if end >= 0 else None]
    named = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert sorted(named) == sorted({name.removeprefix("specdecpp.") for name in modules()} | {"__init__"})
