"""The package's layout: no module imports one that imports it back, directly or through others."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specdecpp"


def module_name(path: Path) -> str:
    """`specdecpp/evaluation/runner.py` -> `specdecpp.evaluation.runner` (a package's `__init__` is the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, modules: set[str], inside_functions: bool = False) -> set[str]:
    """The package's modules that `path` imports at module level (with `inside_functions`, also
    inside functions, where an import runs only when called): `import a.b`, `from a import b`
    (module `a.b` when there is one, else `a`, which holds the name `b`) and relative imports. The
    parent packages Python loads on the way are left out: a package's `__init__` importing its
    modules is no cycle."""
    return imports_of(module_name(path), path.name == "__init__.py", path.read_text(encoding="utf-8"), modules,
                      inside_functions)


def imports_of(name: str, is_package: bool, source: str, modules: set[str], inside_functions: bool = False) -> set[str]:
    """`module_imports` for the module `name` (a package's `__init__` when `is_package`) whose text is `source`."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(source)
    for node in ast.walk(tree) if inside_functions else _module_level(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found |= set(targets) & modules
    return found - {name}


def _module_level(tree: ast.Module):
    """The statements that run on import: the module body, into `if`/`try`/`with` blocks (but not
    into functions or classes, nor into `if TYPE_CHECKING:` blocks, which never run)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [child for part in ("body", "orelse", "finalbody", "handlers") for child in getattr(node, part, [])]
        elif isinstance(node, ast.ExceptHandler):
            todo += node.body


def import_graph(inside_functions: bool = False) -> dict[str, set[str]]:
    """Every module of the package -> the package's modules it imports at module level (and, with
    `inside_functions`, inside functions)."""
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: module_imports(path, set(files), inside_functions) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as `[a, b, ..., a]`, or None (depth-first search, modules in sorted order)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once all it reaches is explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_graph_sees_absolute_relative_and_package_imports():
    graph = import_graph()
    assert "specdecpp.checks" in graph["specdecpp.engine.decoding"]  # from specdecpp.checks import ...
    assert "specdecpp.evaluation.runner" in graph["specdecpp.evaluate"]  # a module of a subpackage
    assert "specdecpp.checks" in graph["specdecpp.models"]  # from specdecpp import checks
    source = ("import json\nfrom .. import a\nfrom . import name_in_sub\nfrom ..b import x\n"
              "if TYPE_CHECKING:\n    from p import e\ndef f():\n    import p.d\n")
    assert imports_of("p.sub.c", False, source, {"p", "p.a", "p.b", "p.d", "p.e", "p.sub", "p.sub.c"}) \
        == {"p.a", "p.sub", "p.b"}  # relative imports resolved; TYPE_CHECKING and function bodies left out
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    # Imports inside functions count: a module that needs another back at call time is still a cycle.
    cycle = find_cycle(import_graph(inside_functions=True))
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """The package's modules that importing `start` loads at module level: itself and every module
    it imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        if (node := todo.pop()) not in seen:
            seen.add(node)
            todo += graph[node]
    return seen


def outside_imports(path: Path) -> set[str]:
    """What `path` imports at module level from outside the package, as written: `import a.b` ->
    `a.b`, `from a.b import c` -> `a.b` and `a.b.c` (so that a class such as `transformers.Trainer`
    can be looked for by name)."""
    found = set()
    for node in _module_level(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] != "specdecpp"}


TRAINING = ("accelerate", "datasets", "transformers.Trainer", "transformers.TrainingArguments", "transformers.trainer")


def test_the_head_stands_on_neither_its_card_nor_the_cost_model():
    """The nn.Module the engine loads does not load the card renderer (`head_folder`) or the cost
    model it prices with; saving a folder imports them when it is called."""
    assert not reach(import_graph(), "specdecpp.head.model") & {"specdecpp.head.folder", "specdecpp.costs"}


def test_the_loss_and_the_metric_load_no_training():
    """`objective` (the loss, the binary KL) loads none of accelerate, datasets or the Trainer, and
    what measures a head (calibration, the benchmarks) does not import `train`."""
    graph = import_graph()
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    loaded = {name for module in reach(graph, "specdecpp.head.objective") for name in outside_imports(files[module])}
    assert not {name for name in loaded if name.startswith(TRAINING)}, loaded
    assert "specdecpp.train" not in reach(graph, "specdecpp.calibration.report")
    for benchmark in sorted((PACKAGE.parent / "benchmarks").glob("*.py")):
        uses = imports_of(benchmark.stem, False, benchmark.read_text(encoding="utf-8"), set(graph))
        assert not any("specdecpp.train" in reach(graph, module) for module in uses), benchmark.name


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's layer: 1 for a module that imports none of `graph`'s, else one more than the
    highest layer among those it imports (the graph has no cycle)."""
    found: dict[str, int] = {}

    def layer(node: str) -> int:
        if node not in found:
            found[node] = 1 + max((layer(nxt) for nxt in graph[node]), default=0)
        return found[node]

    return {node: layer(node) for node in graph}


def package_and_benchmarks_graph() -> dict[str, set[str]]:
    """`import_graph()` with the benchmark scripts added as `benchmarks.<name>`: each imports the
    package's modules and the sibling scripts it names as top-level modules (`from harness import
    ...`: `python benchmarks/<name>.py` puts benchmarks/ on sys.path)."""
    graph = import_graph()
    scripts = sorted((PACKAGE.parent / "benchmarks").glob("*.py"))
    siblings = {path.stem for path in scripts}
    for path in scripts:
        source = path.read_text(encoding="utf-8")
        graph[f"benchmarks.{path.stem}"] = imports_of(path.stem, False, source, set(graph)) \
            | {f"benchmarks.{name}" for name in imports_of(path.stem, False, source, siblings)}
    return graph


def test_layers_the_engine_stands_low():
    """At most 9 layers, the package and the benchmarks together, and the decode loop no higher
    than layer 5: the loop stands on the draft step's backends and the schedules, which stand on
    the settings, the head and processing (docs/design.md, Layout)."""
    assert layers({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == {"a": 3, "b": 2, "c": 1}
    found = layers(package_and_benchmarks_graph())
    assert max(found.values()) <= 9, sorted(found.items(), key=lambda item: -item[1])[:5]
    assert found["specdecpp.engine.decoding"] <= 5, found["specdecpp.engine.decoding"]


def test_the_package_imports_modules_not_subpackages():
    """The package's modules import one another's modules, never a subpackage's `__init__` (which
    would stand on everything the subpackage holds)."""
    graph = import_graph(inside_functions=True)
    packages = {module_name(path) for path in PACKAGE.rglob("__init__.py")}
    assert not {(module, target) for module, targets in graph.items() for target in targets & packages}


def test_the_design_names_every_module_once():
    """docs/design.md's table "Which module owns what" lists each module of the package once, and
    nothing else."""
    text = (PACKAGE.parent / "docs" / "design.md").read_text(encoding="utf-8")
    table = text[text.index("## Which module owns what"):]
    named = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    modules = {module_name(path).removeprefix("specdecpp").lstrip(".") or "__init__"
               for path in PACKAGE.rglob("*.py") if not (path.name == "__init__.py" and path.parent != PACKAGE)}
    assert sorted(named) == sorted(modules)
