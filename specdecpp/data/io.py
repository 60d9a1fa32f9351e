"""Training records on disk (ours and the reference's form): reading, validating, writing; atomic file writes."""
from __future__ import annotations

import ast
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TextIO

LIST_FIELDS = ("tokens", "draft", "log_p_draft", "log_p_target", "p_acc")  # one entry per continuation token
REQUIRED_FIELDS = ("prefix",) + LIST_FIELDS
INT_FIELDS = ("prefix", "tokens", "draft")
CANDIDATE_FIELDS = ("candidates", "candidate_p_acc")  # optional, together: per position, a list per candidate
_SIZE_FIELD = re.compile(r"^log_p_(\d+(?:\.\d+)?)([kmbt]?)$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def _parse_list(value, where: str, name: str) -> list:
    """A list, or the reference's string form of one (JSON, or Python's repr with inf/nan)."""
    if not isinstance(value, str):
        return value
    # Python's repr of float('inf') / float('nan') is neither JSON nor a literal: the last try
    for parse in (json.loads, ast.literal_eval,
                  lambda text: json.loads(re.sub(r"\b(-?)inf\b", r"\1Infinity", text).replace("nan", "NaN"))):
        try:
            return parse(value)
        except (ValueError, SyntaxError):  # json.JSONDecodeError is a ValueError
            pass
    raise ValueError(f"{where}: field {name!r} is a string that is not a list: {value[:60]!r}")


def _rename_size_fields(record: dict, where: str) -> dict:
    """`log_p_7b`/`log_p_70b` -> `log_p_draft`/`log_p_target`: the smaller model is the draft."""
    sizes = {k: float(m.group(1)) * _UNITS[m.group(2).lower()] for k in record if (m := _SIZE_FIELD.match(k))}
    if not sizes or "log_p_draft" in record or "log_p_target" in record:
        return record
    if len(sizes) != 2 or len(set(sizes.values())) != 2:
        raise ValueError(f"{where}: cannot tell draft from target among log-prob fields {sorted(sizes)} "
                         "(expected two sizes such as log_p_7b and log_p_70b)")
    draft_key, target_key = sorted(sizes, key=sizes.get)
    renamed = {k: v for k, v in record.items() if k not in sizes}
    renamed["log_p_draft"], renamed["log_p_target"] = record[draft_key], record[target_key]
    return renamed


def normalize_record(record: dict, where: str = "record") -> dict:
    """Our form of one record, or a ValueError naming the record and its wrong field."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    record = _rename_size_fields(record, where)
    if missing := [k for k in REQUIRED_FIELDS if k not in record]:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)} (a record needs {', '.join(REQUIRED_FIELDS)})")
    record = dict(record)
    for name in REQUIRED_FIELDS:
        record[name] = _parse_list(record[name], where, name)
        if not isinstance(record[name], list):
            raise ValueError(f"{where}: field {name!r} must be a list, got {type(record[name]).__name__}")
    lengths = {name: len(record[name]) for name in LIST_FIELDS}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{where}: lists of different lengths: " + ", ".join(f"{k}={v}" for k, v in lengths.items()))
    for name in INT_FIELDS:
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in record[name]):
            raise ValueError(f"{where}: field {name!r} must hold non-negative integer token ids")
    if not all(isinstance(p, (int, float)) and 0.0 <= p <= 1.0 for p in record["p_acc"]):
        raise ValueError(f"{where}: p_acc values must lie in [0, 1]")
    for name in ("log_p_draft", "log_p_target"):
        if not all(isinstance(v, (int, float)) and not math.isnan(v) for v in record[name]):
            raise ValueError(f"{where}: field {name!r} must hold numbers")
    check_candidates(record, where)
    if not isinstance(record.get("processing", {}), dict):
        raise ValueError(f"{where}: field 'processing' must be an object (generate's processor fields by name), "
                         f"got {type(record['processing']).__name__}")
    return record


def check_candidates(record: dict, where: str) -> None:
    """The optional `candidates` and `candidate_p_acc`: both or neither; per position one non-empty list of token
    ids, the drafted token first, and one acceptance quantity in [0, 1] per candidate."""
    present = [name for name in CANDIDATE_FIELDS if name in record]
    if not present:
        return
    if len(present) == 1:
        raise ValueError(f"{where}: field {present[0]!r} needs {' and '.join(CANDIDATE_FIELDS)} together")
    candidates, labels = record["candidates"], record["candidate_p_acc"]
    if not (isinstance(candidates, list) and isinstance(labels, list)
            and len(candidates) == len(labels) == len(record["draft"])):
        raise ValueError(f"{where}: candidates and candidate_p_acc must be lists with one entry per continuation token")
    for i, (tokens, p_acc, drafted) in enumerate(zip(candidates, labels, record["draft"])):
        if not (isinstance(tokens, list) and tokens and all(isinstance(t, int) and not isinstance(t, bool)
                                                            and t >= 0 for t in tokens)):
            raise ValueError(f"{where}: candidates[{i}] must be a non-empty list of non-negative token ids")
        if tokens[0] != drafted:
            raise ValueError(f"{where}: candidates[{i}] must start with the drafted token {drafted}, got {tokens[0]}")
        if not (isinstance(p_acc, list) and len(p_acc) == len(tokens)
                and all(isinstance(p, (int, float)) and 0.0 <= p <= 1.0 for p in p_acc)):
            raise ValueError(f"{where}: candidate_p_acc[{i}] must hold one value in [0, 1] per candidate")


def read_json_rows(path: str | os.PathLike) -> list[tuple[str, object]]:
    """The values of a JSON Lines file (or one JSON array), each with where it stands (`<path>: line N`); lines
    split on "\n" alone, and one that is not JSON is a ValueError naming it."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
        return [(f"{path}: record {i}", value) for i, value in enumerate(values)]
    rows = []
    for line_no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"{path}: line {line_no}", json.loads(line)))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: line {line_no} is not valid JSON ({error.msg} at column {error.colno}); "
                             "was the file cut short?") from None
    return rows


def read_records(path: str | os.PathLike) -> list[dict]:
    """All records of a JSON Lines file or a JSON array, normalized and validated; ValueError for none."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no data file at {os.fspath(path)}")
    records = [normalize_record(value, where) for where, value in read_json_rows(path)]
    if not records:
        raise ValueError(f"{os.fspath(path)}: no records")
    return records


def to_json_line(record: dict) -> str:
    """One record as one line of JSON; -inf log-probs are written as `-Infinity`."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def read_complete_lines(path: str | os.PathLike) -> tuple[list[dict], int]:
    """The records on the complete lines of a file being appended to, and those lines' byte length."""
    records, good = [], 0
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
            good += len(line)
    return records, good


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[TextIO]:
    """A temporary file renamed onto `path` when the block ends without an error: `path` holds old or new, whole."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"  # same folder, so the rename is atomic
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str | os.PathLike, data, indent: int | None = None) -> None:
    """Write `data` to `path` as JSON, newline-terminated, atomically."""
    with atomic_write(path) as f:
        f.write(json.dumps(data, indent=indent) + "\n")


def write_records(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """Write records as JSON Lines, atomically."""
    with atomic_write(path) as f:
        for record in records:
            f.write(to_json_line(record))
