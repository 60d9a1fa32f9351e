"""The standard-library corpus: a stable, disjoint split and the stdlib-heldout prompt set."""
from __future__ import annotations

import ast
import textwrap

import pytest

from specdecpp.data import stdlib_corpus


def test_split_is_stable_and_by_path():
    # Pinned values: a changed hash would silently move files between train and held-out.
    assert stdlib_corpus.split_of("statistics.py") == "heldout"
    assert stdlib_corpus.split_of("argparse.py") == "train"
    assert all(stdlib_corpus.split_of(p) == stdlib_corpus.split_of(p) for p in stdlib_corpus.stdlib_files()[:50])


def test_splits_are_disjoint_and_cover_the_corpus():
    files = stdlib_corpus.stdlib_files()
    train = {p for p, _ in stdlib_corpus.read_split("train")}
    heldout = {p for p, _ in stdlib_corpus.read_split("heldout")}
    assert train and heldout and not train & heldout
    assert train | heldout == set(files)
    assert 0.02 < len(heldout) / len(files) < 0.10


def test_excluded_files_are_not_in_the_corpus():
    for path in stdlib_corpus.stdlib_files():
        parts = path.split("/")
        assert not {"site-packages", "test", "tests", "encodings"} & set(parts), path
        assert not parts[-1].startswith("_sysconfigdata"), path


def test_heldout_prompts_are_def_and_docstring_from_heldout_files():
    functions = stdlib_corpus.heldout_functions()
    assert len(functions) > 100
    heldout = {p for p, _ in stdlib_corpus.read_split("heldout")}
    for f in functions[:40]:
        assert f.path in heldout
        assert f.prompt.startswith(("def ", "async def ")) and f.prompt.endswith("\n")
        assert f.source.startswith(f.prompt) and len(f.source) > len(f.prompt)
        # The whole function parses; its first statement is the docstring the prompt ends with.
        node = ast.parse(f.source).body[0]
        assert ast.get_docstring(node, clean=False) is not None
    prompts = stdlib_corpus.heldout_function_prompts(limit=5)
    assert prompts == [f.prompt for f in functions[:5]]


def test_functions_of_dedents_methods_and_skips_undocumented():
    source = textwrap.dedent('''\
        class A:
            @property
            def f(self, x):
                """Return x."""
                return x

            def g(self):
                return 1

            def h(self):
                """Only a docstring."""
        ''')
    [f] = stdlib_corpus._functions_of("mod.py", source)
    assert f.prompt == 'def f(self, x):\n    """Return x."""\n'
    assert f.source == f.prompt + "    return x\n"


@pytest.mark.slow  # parses the standard library
def test_train_prompts_come_from_train_files_only_and_are_disjoint_from_heldout():
    train_functions = stdlib_corpus.split_functions("train")
    heldout_functions = stdlib_corpus.heldout_functions()
    train_paths = {f.path for f in train_functions}
    heldout_paths = {f.path for f in heldout_functions}
    assert len(train_functions) > len(heldout_functions) > 100
    assert all(stdlib_corpus.split_of(p) == "train" for p in train_paths)
    assert not train_paths & heldout_paths
    prompts = stdlib_corpus.train_function_prompts(limit=5)
    assert prompts == [f.prompt for f in train_functions[:5]]


def test_split_functions_rejects_unknown_split():
    with pytest.raises(ValueError):
        stdlib_corpus.split_functions("dev")
