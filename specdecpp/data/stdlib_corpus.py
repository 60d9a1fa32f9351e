"""The standard-library corpus: the interpreter's `.py` files, split into train and held-out by a stable path hash."""
from __future__ import annotations

import ast
import hashlib
import sysconfig
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

HELDOUT_PERCENT = 5

# Skipped: what differs per machine (third-party packages, test suites, build configuration) and data tables.
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "encodings",
                           "pydoc_data", "__pycache__"})
EXCLUDED_PREFIXES = ("_sysconfigdata", "config-")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str) -> str:
    """`heldout` or `train` for a path relative to the stdlib root, by a stable hash of its POSIX path."""
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT else "train"


@lru_cache(maxsize=4)
def stdlib_files(root: str | None = None) -> tuple[str, ...]:
    """Sorted POSIX paths (relative to `root`, default the stdlib root) of the corpus files."""
    base = Path(root) if root is not None else stdlib_root()
    files = (path.relative_to(base) for path in base.rglob("*.py"))
    return tuple(sorted(rel.as_posix() for rel in files
                        if not any(part in EXCLUDED_DIRS or part.startswith(EXCLUDED_PREFIXES) for part in rel.parts)))


def read_split(split: str, root: str | None = None) -> list[tuple[str, str]]:
    """`(relpath, text)` for every corpus file in `split`, sorted by path (files not valid UTF-8 skipped)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
    base = Path(root) if root is not None else stdlib_root()
    out = []
    for rel in stdlib_files(str(base)):
        if split_of(rel) != split:
            continue
        try:
            out.append((rel, (base / rel).read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue
    return out


@dataclass(frozen=True)
class HeldoutFunction:
    """A documented function: `prompt` its `def` line(s) and docstring, `source` the whole function, dedented."""
    path: str
    lineno: int
    prompt: str
    source: str


def _functions_of(rel: str, text: str) -> list[HeldoutFunction]:
    """The documented functions of one file that have a body beyond the docstring."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines, out = text.splitlines(keepends=True), []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = node.body[0] if node.body else None
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)) or len(node.body) < 2:
            continue
        prompt = textwrap.dedent("".join(lines[node.lineno - 1:doc.end_lineno]))
        source = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno]))
        out.append(HeldoutFunction(rel, node.lineno, prompt, source))
    return out


@lru_cache(maxsize=8)
def split_functions(split: str, root: str | None = None) -> tuple[HeldoutFunction, ...]:
    """Every documented function of `split`'s files, in a stable order that mixes files."""
    functions = [f for rel, text in read_split(split, root) for f in _functions_of(rel, text)]
    return tuple(sorted(functions, key=lambda f: hashlib.sha256(f"{f.path}:{f.lineno}".encode()).hexdigest()))


def heldout_functions(root: str | None = None) -> tuple[HeldoutFunction, ...]:
    return split_functions("heldout", root)


def heldout_function_prompts(limit: int | None = None, root: str | None = None) -> list[str]:
    """The `stdlib-heldout` prompt set: held-out functions' `def` lines and docstrings (`limit`: a prefix)."""
    return [f.prompt for f in heldout_functions(root)[:limit]]


def train_function_prompts(limit: int | None = None, root: str | None = None) -> list[str]:
    """The `stdlib-train` prompt set, from the train split's files."""
    return [f.prompt for f in split_functions("train", root)[:limit]]
