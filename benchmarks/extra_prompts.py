"""More stdlib-train prompts than the 6,338 documented functions give, for the shipped head's records: each
undocumented function's `def` line(s) and each documented class's `class` line and docstring, from the train
split's files only, in a stable order that mixes files (`checkpoints/zoo/head/card.json`, data).

    python benchmarks/extra_prompts.py data/generated/stdlib-train-extra-prompts.jsonl
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import textwrap

from specdecpp.data.stdlib_corpus import read_split


def is_docstring(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def header_end(node: ast.AST) -> int | None:
    """The last line of the prompt `node` gives: an undocumented function's signature (and the comments before its
    first statement) or a documented class's docstring; None for any other node, or one with a one-statement body."""
    body = getattr(node, "body", None)
    if not isinstance(body, list) or len(body) < 2 or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                               ast.ClassDef)):
        return None
    if isinstance(node, ast.ClassDef):
        return body[0].end_lineno if is_docstring(body[0]) else None
    return None if is_docstring(body[0]) else body[0].lineno - 1


def extra_prompts(path: str, text: str) -> list[tuple[str, str]]:
    """`(key, prompt)` for one file: undocumented functions' headers, documented classes' headers and docstrings."""
    try:
        nodes = list(ast.walk(ast.parse(text)))
    except SyntaxError:
        return []
    lines = text.splitlines(keepends=True)
    prompts = [(f"{path}:{node.lineno}", textwrap.dedent("".join(lines[node.lineno - 1:end])))
               for node in nodes if (end := header_end(node)) is not None]
    return [(key, prompt) for key, prompt in prompts if prompt.strip()]


def main(argv: list[str] | None = None) -> int:
    """Write the prompts (JSON Lines: `source`, `prompt`) and return how many."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", help="the prompt file to write")
    parser.add_argument("--root", default=None, help="the standard library's folder (default: this interpreter's)")
    args = parser.parse_args(argv)
    rows = [row for rel, text in read_split("train", args.root) for row in extra_prompts(rel, text)]
    rows.sort(key=lambda row: hashlib.sha256(row[0].encode()).hexdigest())
    with open(args.output, "w", encoding="utf-8") as f:
        for key, prompt in rows:
            f.write(json.dumps({"source": key, "prompt": prompt}) + "\n")
    print(f"{len(rows)} prompts -> {args.output}")
    return len(rows)


if __name__ == "__main__":
    main()
