"""What a new user meets: the shipped DeepSeek-V3 cluster plans as shipped;
compute profiles by name and by their documented path from any directory; a
plan where nothing fits is marked and fails alike with and without --out, and
suggests uneven stages when pp refusals hid configurations; axes without sizes
rank assignments with nothing to reduce last and say when the best matrices
spread another axis over nodes; sizes in bits are refused; calibrate fails
before it says what it measures; wide tables keep their columns."""

from __future__ import annotations

import re

import pytest
from helpers import usage_error

TINY = "layers=6,hidden=256,heads=8,seq=128,vocab=1000"


def test_the_deepseek_v3_cluster_plans_as_shipped(cli):
    code, out, err = cli("plan", "--topology", "dgx-h800", "--scale", "node=2", "--model", TINY,
                         "--global-batch", "32", "--top", "1", "--no-verify")
    assert code == 0, err
    assert "topology dgx-h800: node x2 > gpu x8 (16 devices of NVIDIA H800 SXM5 80GB: 79.647 GiB, 989.4 TFLOP/s " \
           "peak)" in out


@pytest.mark.parametrize("given", ["h100-sxm5-80gb", "profiles/h100-sxm5-80gb.compute.json"])
def test_a_shipped_compute_profile_by_name_or_documented_path_from_anywhere(cli, tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)  # outside the checkout: no profiles/ folder here
    code, out, err = cli("plan", "--topology", "dgx-h800", "--scale", "node=2", "--model", TINY,
                         "--global-batch", "32", "--top", "1", "--no-verify", "--compute-profile", given)
    assert code == 0, err
    assert "compute per operation (h100-sxm5-80gb:" in out
    code, out, err = cli("compute", "--compute-profile", given, "--model", "llama2-7b", "--tp", "8")
    assert code == 0, err
    assert "h100-sxm5-80gb" in out


def test_a_compute_profile_that_is_neither_a_file_nor_shipped_is_refused(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = usage_error(cli, "plan", "--topology", "dgx-h800", "--scale", "node=2", "--model", TINY,
                          "--global-batch", "32", "--compute-profile", "profiles/b300.compute.json")
    assert "profiles/b300.compute.json" in message


NOTHING_FITS = ("plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", "16", "--device",
                "memory_GiB=0.001,peak_TFLOPs=1", "--no-verify", "--top", "3")


def test_when_nothing_fits_the_rows_are_marked_and_both_forms_fail_alike(cli, tmp_path):
    code, out, err = cli(*NOTHING_FITS)
    assert code == 2
    rows = [line for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+", line)]
    assert rows and all("(does not fit) " in row for row in rows), out
    assert err.count("\n") == 1 and err.startswith("synth-reduce: error: no configuration fits in 0.001 GiB")
    with_out = usage_error(cli, *NOTHING_FITS, "--out", tmp_path / "job.json")
    assert err == f"synth-reduce: error: {with_out}\n"
    assert not (tmp_path / "job.json").exists()
    # 6 layers: pp=4 and pp=8 do not divide them, and --stages uneven would evaluate those
    assert with_out.endswith("because pp does not divide the layers: --stages uneven evaluates them")
    uneven = usage_error(cli, *NOTHING_FITS, "--stages", "uneven", "--out", tmp_path / "job.json")
    assert "--stages uneven" not in uneven


def test_axes_without_sizes_rank_nothing_to_reduce_last_and_say_what_they_do_not_price(cli):
    code, out, err = cli("--topology", "dgx-a100", "--axes", "tp<=8,dp,pp", "--reduce", "dp", "--no-verify")
    assert code == 0, err
    rows = [line for line in out.splitlines() if re.match(r"\s+\d+\s+tp=", line)]
    nothing = [n for n, row in enumerate(rows) if "(nothing to do)" in row]
    assert nothing == list(range(len(rows) - 4, len(rows))), out  # dp=1 with tp = 1, 2, 4, 8: last
    spread = [row for row in rows if re.search(r"tp:[2-8],\d", row) and "(nothing to do)" not in row]
    assert spread, out  # some best matrices put tp across nodes for the dp reduction ...
    assert ("the best matrices are chosen for the dp reduction alone: some put tp across nodes, where tp's own "
            "traffic is not priced; keep it inside with --constrain tp@node=1") in out  # ... and that is said
    code, out, err = cli("--topology", "dgx-a100", "--axes", "tp<=8,dp,pp", "--reduce", "dp", "--no-verify",
                         "--constrain", "tp@node=1")
    assert code == 0, err
    assert "chosen for the dp reduction alone" not in out  # tp placed by the user; pp across nodes by design
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    step = header.index("reduction crosses")
    for row in (line for line in out.splitlines() if re.match(r"\s+\d+\s+tp=", line)):
        assert row[step - 1] == " " and row[step] != " ", row  # the matrix stays in its column


@pytest.mark.parametrize("size", ["64Mb", "1Gb", "512kb"])
def test_sizes_in_bits_are_refused(cli, size):
    message = usage_error(cli, "--topology", "testbed-2x4", "--axes", "dp=8", "--size", size)
    unit = size.lstrip("0123456789")
    assert message.startswith(f"--size '{size}': {unit} is bits; give bytes, e.g. ")


def test_calibrate_without_a_gpu_fails_before_saying_what_it_measures(cli, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: calibrate would measure")
    code, out, err = cli("calibrate", "--out", tmp_path / "gpu.compute.json")
    assert code == 2 and out == ""
    assert err == ("synth-reduce: error: calibrate: no CUDA GPU visible to PyTorch; run it on the GPU machine, or "
                   "pass --device cpu to try the mechanics\n")


def test_moe_plan_tables_keep_their_columns(cli):
    code, out, err = cli("plan", "--topology", "dgx-h100", "--scale", "node=4", "--model", "mixtral-8x7b",
                         "--global-batch", "64", "--top", "4", "--no-verify")
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("rank"))
    end = header.index(" step") + len(" step")  # the step column is right-aligned under its header
    rows = [line for line in lines if re.match(r"\s+\d+\s+\d+\s+\d+", line)]
    assert rows
    for row in rows:
        assert re.match(r"[0-9.]+ (s|ms|us)$", row[:end].split("  ")[-1].strip()), row
    # the programs column starts at one place on every row and on each program's own line: nothing overflowed
    starts = {re.search(r"\d+\.\dG\s+[0-9.]+  ", row).end() for row in rows}
    assert len(starts) == 1, starts
    (start,) = starts
    table = lines[lines.index(header) + 2:]
    table = table[:table.index("")] if "" in table else table
    continued = [line for line in table if line not in rows]
    assert continued and all(len(line) - len(line.lstrip()) == start for line in continued)


def test_a_device_without_memory_bandwidth_says_the_curve_leaves_out_its_passes(cli):
    """With the efficiency curve the layers' memory-bound passes are priced at the
    device's memory bandwidth; a --device without one has the curve alone, and
    the header says so and how to give it; with the bandwidth the passes are in
    the step (it is longer) and the header says nothing of it."""
    base = ("plan", "--topology", "dgx-a100", "--scale", "node=1", "--model", TINY, "--global-batch", "8",
            "--axes", "tp=1,dp=8,pp=1", "--top", "1", "--no-verify", "--json")
    import json

    steps, headers = {}, {}
    for given in ("memory_GiB=80,peak_TFLOPs=312", "memory_GiB=80,peak_TFLOPs=312,memory_bandwidth_GBps=2039"):
        code, out, err = cli(*base, "--device", given)
        assert code == 0, err
        steps[given] = json.loads(out)["configurations"][0]["predicted_step_s"]
        code, out, err = cli(*base[:-1], "--device", given)
        assert code == 0, err
        headers[given] = out
    without, with_bandwidth = steps.values()
    assert with_bandwidth > without
    note = ("the layers' memory-bound passes not priced: the device has no memory bandwidth "
            "(--device ...,memory_bandwidth_GBps=G)")
    assert [note in text for text in headers.values()] == [True, False]
