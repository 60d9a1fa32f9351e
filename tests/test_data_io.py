"""Record files: our JSON Lines, the reference's JSON array, and clear errors on bad records."""
from __future__ import annotations

import json

import pytest

from specdecpp.data.io import (atomic_write, normalize_record, read_complete_lines, read_records, to_json_line,
                               write_json, write_records)
from specdecpp.data.prompts import load_prompts

RECORD = {"prompt": "p", "prefix": [1, 7], "continuation": "a b", "tokens": [4, 5, 2], "draft": [4, 9, 2],
          "log_p_draft": [-0.1, -0.5, -0.2], "log_p_target": [-0.2, float("-inf"), -0.1], "p_acc": [1.0, 0.0, 0.5]}
CANDIDATES = {"candidates": [[4, 6], [9, 5, 3], [2]], "candidate_p_acc": [[1.0, 0.0], [0.0, 1.0, 0.0], [0.5]]}


def test_jsonl_round_trip(tmp_path):
    processed = RECORD | {"prompt": "q", "processing": {"repetition_penalty": 1.2}}
    write_records(tmp_path / "d.jsonl", [RECORD, processed, RECORD | CANDIDATES])
    records = read_records(tmp_path / "d.jsonl")
    assert records == [RECORD, processed, RECORD | CANDIDATES]
    assert not list(tmp_path.glob("*.tmp*"))


def test_text_with_line_separators_round_trips_through_records_and_prompts(tmp_path):
    """Records are written with ensure_ascii=False, so U+2028, U+2029 and U+0085, which
    `str.splitlines()` takes for line ends, stand unescaped on a line (JSON escapes the ASCII
    ones); one reader splits lines on "\\n" alone for records and prompts, and the records read
    back as written, lines counted right."""
    text = "a\u2028b\u2029c\x85d"
    odd = RECORD | {"prompt": text, "continuation": text}
    write_records(tmp_path / "d.jsonl", [odd, RECORD, odd])
    assert text in (tmp_path / "d.jsonl").read_text(encoding="utf-8")  # written raw, not escaped
    assert read_records(tmp_path / "d.jsonl") == [odd, RECORD, odd]
    assert read_complete_lines(tmp_path / "d.jsonl")[0] == [odd, RECORD, odd]
    assert load_prompts(str(tmp_path / "d.jsonl")) == [text, "p", text]  # a records file is a prompt source
    with open(tmp_path / "d.jsonl", "a", encoding="utf-8") as f:
        f.write(to_json_line(odd)[:-5])
    with pytest.raises(ValueError, match="line 4 is not valid JSON"):
        read_records(tmp_path / "d.jsonl")


def test_reference_format_loads_as_ours(tmp_path):
    reference = {"prompt": "p", "prefix": "[1, 7]", "continuation": "a b", "tokens": "[4, 5, 2]", "draft": "[4, 9, 2]",
                 "log_p_7b": "[-0.1, -0.5, -0.2]", "log_p_70b": "[-0.2, -inf, -0.1]", "p_acc": "[1.0, 0.0, 0.5]"}
    (tmp_path / "ref.json").write_text(json.dumps([reference, reference], indent=1))
    assert read_records(tmp_path / "ref.json") == [RECORD, RECORD]
    # sizes decide which is the draft, whatever the order or the unit
    swapped = {k: v for k, v in reference.items() if not k.startswith("log_p")} | {
        "log_p_1.7B": reference["log_p_70b"], "log_p_135M": reference["log_p_7b"]}
    assert normalize_record(swapped) == RECORD


@pytest.mark.parametrize("change, message", [
    ({"draft": None}, "missing field"),
    ({"p_acc": [1.0, 0.0]}, "different lengths: tokens=3, draft=3, log_p_draft=3, log_p_target=3, p_acc=2"),
    ({"tokens": [4, 5.5, 2]}, "integer token ids"),
    ({"p_acc": [1.0, 1.5, 0.0]}, r"\[0, 1\]"),
    ({"prefix": "not a list"}, "not a list"),
    ({"log_p_draft": [-0.1, None, -0.2]}, "must hold numbers"),
    ({"processing": [["repetition_penalty", 1.2]]}, "'processing' must be an object"),
    ({"candidates": CANDIDATES["candidates"]}, "'candidates' needs candidates and candidate_p_acc together"),
    (CANDIDATES | {"candidates": [[4], [9]], "candidate_p_acc": [[1.0], [0.0]]}, "one entry per continuation token"),
    (CANDIDATES | {"candidates": [[4, 6], [5, 9, 3], [2]]}, r"candidates\[1\] must start with the drafted token 9"),
    (CANDIDATES | {"candidates": [[4, 6], [], [2]]}, r"candidates\[1\] must be a non-empty list"),
    (CANDIDATES | {"candidate_p_acc": [[1.0, 0.0], [0.0, 1.0], [0.5]]}, r"candidate_p_acc\[1\] must hold one value"),
    (CANDIDATES | {"candidate_p_acc": [[1.0, 2.0], [0.0, 1.0, 0.0], [0.5]]}, r"candidate_p_acc\[0\]"),
])
def test_bad_records_name_the_problem(change, message):
    record = {k: v for k, v in (RECORD | change).items() if v is not None}
    with pytest.raises(ValueError, match=message):
        normalize_record(record, "f.jsonl: line 3")


def test_ambiguous_size_fields_are_refused():
    record = {k: v for k, v in RECORD.items() if not k.startswith("log_p")} | {"log_p_7b": [0, 0, 0], "log_p_7B": [0, 0, 0]}
    with pytest.raises(ValueError, match="cannot tell draft from target"):
        normalize_record(record)


def test_file_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(to_json_line(RECORD) + '{"prompt": "cut')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_records(path)
    path.write_text(to_json_line(RECORD) + to_json_line({k: v for k, v in RECORD.items() if k != "p_acc"}))
    with pytest.raises(ValueError, match=r"d.jsonl: line 2: missing field\(s\) p_acc"):
        read_records(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        read_records(path)
    with pytest.raises(FileNotFoundError):
        read_records(tmp_path / "absent.jsonl")


def test_complete_lines_stop_before_a_torn_line(tmp_path):
    path = tmp_path / "shard.jsonl"
    whole = to_json_line(RECORD) * 2
    path.write_text(whole + '{"index": 3, "tok')
    records, length = read_complete_lines(path)
    assert len(records) == 2 and length == len(whole.encode())


def test_a_write_interrupted_by_an_exception_leaves_the_old_file_intact(tmp_path):
    path = tmp_path / "results.json"
    write_json(path, [{"id": 0}])
    with pytest.raises(RuntimeError):
        with atomic_write(path) as f:
            f.write('[{"id": 0}, {"id": 1, "half wri')
            raise RuntimeError("interrupted")
    assert json.loads(path.read_text()) == [{"id": 0}]

    def interrupted_records():
        yield RECORD
        raise KeyboardInterrupt  # what SIGINT raises, here in the middle of writing records

    with pytest.raises(KeyboardInterrupt):
        write_records(path, interrupted_records())
    assert json.loads(path.read_text()) == [{"id": 0}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"], "no temporary file is left behind"
    write_json(path, {"a": 1}, indent=1)
    assert path.read_text() == '{\n "a": 1\n}\n'
