"""Measurement records that cannot be measurements are refused with the
field named, so fit and validate never use them: times that are NaN,
infinite, zero or negative, a median outside its own times or min above
max, an element type or backend bench does not write, a size that is not a
whole number of elements, ranks other than the topology's devices, a
negative count of wrong elements. A file is refused whole at its first bad
line (the line is named), as for every other record problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import usage_error

from synth.cost.records import read_records
from synth.errors import SynthError

SHIPPED = Path(__file__).resolve().parents[2] / "docs" / "results" / "data" / "testbed-2x4-ring.jsonl"


def good_record() -> dict:
    return json.loads(SHIPPED.read_text().splitlines()[0])


CASES = {
    "NaN median": ({"median_s": float("nan")}, "size_bytes must be >= 1 and median_s a positive number"),
    "negative time": ({"times_s": [0.001, -0.001]}, "'times_s' must hold positive finite seconds, got -0.001"),
    "infinite time": ({"times_s": [0.001, float("inf")]}, "'times_s' must hold positive finite seconds, got inf"),
    "negative min": ({"min_s": -1.0}, "'min_s' must be a positive finite number of seconds, got -1.0"),
    "min above max": ({"min_s": 0.002, "max_s": 0.001, "median_s": 0.0015, "times_s": [0.0015]},
                      "median_s 0.0015 lies outside min_s..max_s (0.002..0.001); the record is inconsistent"),
    "median outside times": ({"times_s": [0.5, 0.6], "min_s": None, "max_s": None},
                             "'median_s' 0.0013012945000000498 lies outside its times_s (0.5..0.6)"),
    "bogus dtype": ({"dtype": "float33"}, "'dtype' 'float33' is not an element type bench measures; one of "
                                          "float32, float64, int32, int64, float16, bfloat16"),
    "bogus backend": ({"backend": "carrier-pigeon"}, "'backend' 'carrier-pigeon' is not a backend bench runs"),
    "partial element": ({"size_bytes": 65538}, "'size_bytes' 65538 is not a whole number of float32 elements "
                                               "(4 bytes each)"),
    "ranks off topology": ({"ranks": 16}, "'ranks' 16 is not the 8 devices of the record's topology"),
    "negative wrong": ({"wrong": -3}, "'wrong' must be a count of wrong elements >= 0, got -3"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_record_that_cannot_be_a_measurement_is_refused_by_field(tmp_path, case):
    change, message = CASES[case]
    bad = {**good_record(), **change}
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(good_record()) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SynthError) as error:
        read_records(path)
    assert str(error.value).startswith(f"{path}:2: ") and message in str(error.value), str(error.value)


def test_fit_and_validate_refuse_the_file_naming_the_line(cli, tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({**good_record(), "dtype": "float33"}) + "\n")
    assert usage_error(cli, "fit", path, "--output", tmp_path / "p.json").startswith(f"{path}:1: 'dtype' 'float33'")
    assert usage_error(cli, "validate", path).startswith(f"{path}:1: 'dtype' 'float33'")
    assert not (tmp_path / "p.json").exists()


def test_the_shipped_records_are_all_accepted():
    topology, records = read_records(SHIPPED)
    assert len(records) == len([line for line in SHIPPED.read_text().splitlines() if line.strip()])
