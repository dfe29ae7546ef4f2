"""What a newcomer meets first: the command list and help of every command,
unknown commands, the tables' wording and layout, the one matrix notation,
repeatable options, --workload with --out, unreadable or deeply nested input
files and Ctrl-C during start-up."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import usage_error
from processes import limit_s

from synth.cli import main
from synth.cli.args import Parser
from synth.cli.bench import request_of
from synth.cli.commands import COMMANDS, SUMMARIES

REPO = Path(__file__).resolve().parents[2]
P2 = ("--topology", "p2-a100", "--axes", "dp=4,mp=16")


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


# ---------------------------------------------------------------- commands and help


def test_the_main_help_lists_every_command_with_its_summary(capsys):
    text = help_of(capsys)
    assert set(SUMMARIES) == set(COMMANDS)  # a command added to COMMANDS needs its line
    listed = text[text.index("commands:\n"):].splitlines()[1:len(COMMANDS) + 1]
    assert [line.split()[0] for line in listed] == list(COMMANDS)
    for line, (name, summary) in zip(listed, ((n, SUMMARIES[n]) for n in COMMANDS)):
        assert line.split(None, 1)[1] == summary, line
    assert text.startswith("usage: synth-reduce --topology T --axes AXES [options]\n"
                           "       synth-reduce COMMAND [options]")


COMMAND_LINES = [[], *([name] for name in COMMANDS), ["bench", "plan.json"], ["emulate", "plan"], ["emulate", "down"]]


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=lambda argv: " ".join(argv) or "main")
def test_every_option_of_every_command_has_help_text(monkeypatch, argv):
    parsers = []

    def capture(self, args=None, namespace=None):
        parsers.append(self)
        raise KeyboardInterrupt  # stop before any work; main() turns it into exit code 130

    monkeypatch.setattr(Parser, "parse_args", capture)
    assert main([*argv, "--topology", "testbed-2x4", "--", "true"] if argv == ["emulate"] else argv) == 130
    (parser,) = parsers
    missing = [a.option_strings or a.dest for a in parser._actions if not a.help]
    assert not missing, f"{parser.prog}: options without help: {missing}"


def test_bench_and_tune_usage_lines_show_how_they_are_called(capsys):
    assert help_of(capsys, "bench").startswith("usage: synth-reduce bench PLAN.json [options]\n"
                                               "       synth-reduce bench --topology T --axes AXES [options]\n")
    assert help_of(capsys, "tune").startswith("usage: synth-reduce tune --topology T --axes AXES --out PLAN.json "
                                              "[options]\n")


def test_an_unknown_command_is_named_with_the_list(cli):
    assert usage_error(cli, "frobnicate", "--topology", "x") == (
        "unknown command 'frobnicate'; the commands are " + ", ".join(COMMANDS)
        + ", or the main command's options (see 'synth-reduce --help')")


# ---------------------------------------------------------------- tables


def test_the_table_names_the_default_of_the_collective(cli):
    code, out, _ = cli("--topology", "testbed-2x4", "--axes", "dp=8", "--collective", "reducescatter", "--no-verify")
    assert code == 0 and "default = one ReduceScatter over each whole reduction group" in out
    assert "AllReduce over each" not in out


def test_top_0_lists_no_program_and_says_nothing_about_the_step_limit(cli):
    code, out, _ = cli(*P2, "--reduce", "dp", "--top", "0")
    rows = [line for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+dp:", line)]
    assert code == 0 and len(rows) == 3
    assert all(line.endswith("x") for line in rows), rows  # the speedup column ends each row
    assert "none within the step limit" not in out


def test_one_step_is_singular(cli):
    code, out, _ = cli("--topology", "testbed-2x4", "--axes", "dp=8", "--max-steps", "1", "--no-verify")
    assert code == 0 and "program(s) of at most 1 step;" in out


def test_columns_stay_apart_on_a_four_level_topology(cli):
    code, out, _ = cli("--topology", "rack", "--axes", "dp=8,mp=8", "--max-steps", "2", "--top", "1", "--no-verify")
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("rank"))
    crosses, progs = header.index("reduction crosses"), header.index("progs")
    rows = [line for line in lines if re.match(r"\s+\d+\s+\d+\s+dp:", line)]
    assert code == 0 and len(rows) == 10 and any("cpu x2 > gpu x" in row for row in rows)
    for row in rows:
        assert row[crosses - 1] == " " and row[crosses] != " ", row  # the matrix ends before the next column
        assert re.fullmatch(r"(dp:[\d,]+ / mp:[\d,]+) +", row[header.index("matrix"):crosses]), row
        assert row[progs - 1] == " ", row


# ---------------------------------------------------------------- the matrix notation


def test_one_matrix_notation_is_printed_by_every_command_and_read_back(cli, tmp_path):
    code, out, _ = cli(*P2, "--reduce", "dp", "--top", "1", "--no-verify")
    printed = re.findall(r"^\s+\d+\s+\d+\s+(dp:[\d,]+ / mp:[\d,]+)\s", out, re.M)
    assert code == 0 and sorted(printed) == ["dp:1,4 / mp:4,4", "dp:2,2 / mp:2,8", "dp:4,1 / mp:1,16"]
    program = tmp_path / "p.txt"
    program.write_text("AllReduce(root, inside)\n")
    for matrix in printed:
        code, out, err = cli("check", program, *P2, "--matrix", matrix)
        assert code == 0 and f"  {matrix}: valid" in out, err
    # rows in any order, without spaces, or unnamed in axis order ('2,2;2,8', the earlier form) all read alike
    for spelling in ("mp:2,8 / dp:2,2", "dp:2,2/mp:2,8", "2,2;2,8", "2,2 / 2,8"):
        code, out, err = cli("check", program, *P2, "--matrix", spelling)
        assert code == 0 and "  0  dp:2,2 / mp:2,8: valid" in out, (spelling, err)
    plan = tmp_path / "plan.json"
    assert cli(*P2, "--placement", "1", "--out", plan, "--no-verify")[0] == 0
    code, out, _ = cli("verify", plan)
    assert code == 0 and out.startswith(f"{plan}: verified allreduce over dp on dp:2,2 / mp:2,8\n")


# ---------------------------------------------------------------- repeatable options


def test_scale_is_repeatable_on_every_command(cli):
    code, out, _ = cli("--topology", "p2-a100", "--scale", "node=2", "--scale", "gpu=8", "--axes", "dp=4,mp=4",
                       "--json", "--no-verify", "--top", "0")
    assert code == 0 and [lv["count"] for lv in json.loads(out)["topology"]["levels"]] == [2, 8]
    request = request_of(["--topology", "testbed-2x4", "--scale", "node=1", "--scale", "rank=2", "--axes", "dp=2",
                          "--out", "t.json"],
                         tune=True)
    assert request.problem.scale == ("node=1", "rank=2") and request.problem.build().topology.counts == (1, 2)
    code, out, _ = cli("emulate", "plan", "--topology", "testbed-2x4", "--scale", "node=3", "--scale", "rank=2")
    assert code == 0 and "3 nodes x 2 ranks = 6 MPI ranks" in out


# ---------------------------------------------------------------- --workload


def test_workload_writes_the_plan_of_the_chosen_placement_with_every_items_best_program(cli, tmp_path):
    plan = tmp_path / "job.json"
    workload = "dp:allreduce:1GiB,mp:allreduce:64MiB*48,dp:allreduce:4K"
    code, out, err = cli(*P2, "--workload", workload, "--placement", "1", "--json", "--out", plan)
    assert code == 0, err
    chosen = next(p for p in json.loads(out)["placements"] if p["index"] == 1)
    best = {(tuple(i["reduce"]), i["size_bytes"]): i["best_program"]["text"] for i in chosen["items"]}
    doc = json.loads(plan.read_text())
    assert doc["matrix"] == chosen["matrix"] and len(doc["reductions"]) == 2
    for reduction in doc["reductions"]:
        for (axes, size), text in best.items():
            if axes == tuple(reduction["reduce"]):  # the program of the range holding the item's size is its best
                ranges = [p for p in reduction["programs"]
                          if p["min_bytes"] <= size and (p["max_bytes"] is None or size < p["max_bytes"])]
                assert [p["text"] for p in ranges] == [text]
    code, out, err = cli("verify", plan)
    assert code == 0 and out.count(": verified allreduce over") == sum(len(r["programs"]) for r in doc["reductions"])


@pytest.mark.parametrize("option", [["--top", "2"], ["--program", "1"]])
def test_workload_refuses_options_that_pick_programs_of_one_reduction(cli, option):
    message = usage_error(cli, *P2, "--workload", "dp:allreduce:1GiB", *option)
    assert message == (f"{option[0]} lists or picks programs of one reduction; with --workload every item uses its "
                       "best predicted program (leave out --workload to list the programs of one)")


def test_out_is_checked_before_the_work(cli, monkeypatch, tmp_path):
    def no_work(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr("synth.cli.solve.solve_problem", no_work)
    monkeypatch.setattr("synth.cli.solve.rank_problem_placements", no_work)
    out = tmp_path / "missing" / "plan.json"
    expected = f"--out {out}: the folder {out.parent} does not exist; create it or write elsewhere"
    assert usage_error(cli, *P2, "--out", out) == expected
    assert usage_error(cli, *P2, "--workload", "dp:allreduce:1M", "--out", out) == expected
    assert usage_error(cli, *P2, "--out", tmp_path) == f"--out {tmp_path}: is a folder; give a file name"


# ---------------------------------------------------------------- unreadable and deeply nested files


def test_check_of_a_binary_file_is_one_line(cli, tmp_path):
    binary = tmp_path / "program.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    assert usage_error(cli, "check", binary, *P2) == (
        f"{binary}: not a text file (a program is UTF-8 text, e.g. 'ReduceScatter(node, inside)' on its first line)")


DEEP = 100_000  # deeper than Python's parsers recurse


@pytest.mark.parametrize("argv, text, expected", [
    (["verify", "{f}"], "[" * DEEP, "{f}: not a valid plan: corrupted JSON (nested more than 32 levels deep)"),
    (["verify", "{f}"], '{"a": ' * 40 + "1" + "}" * 40,
     "{f}: not a valid plan: corrupted JSON (nested more than 32 levels deep)"),
    (["--topology", "testbed-2x4", "--axes", "dp=8", "--profile", "{f}"], "[" * DEEP,
     "{f}: not a valid profile: corrupted JSON (nested more than 32 levels deep)"),
    (["fit", "{f}", "-o", "out.json"], "[" * DEEP, "{f}:1: not valid JSON (nested more than 32 levels deep)"),
    (["validate", "{f}"], "1" * 5000, "{f}:1: not valid JSON (Exceeds the limit (4300 digits)"),
    (["--topology", "{f}", "--axes", "dp=8"], "levels: " + "[" * DEEP,
     "{f}: malformed YAML: nested more than 32 levels deep"),
    (["--topology", "{f}", "--axes", "dp=8"], "levels: &a [*a]", "{f}: malformed YAML: nested more than 32 levels deep"),
])
def test_deeply_nested_or_huge_input_is_one_line(cli, tmp_path, argv, text, expected):
    path = tmp_path / "input"
    path.write_text(text)
    message = usage_error(cli, *(a.format(f=path) for a in argv))
    assert message.startswith(expected.format(f=path)), message


# ---------------------------------------------------------------- Ctrl-C during start-up

# a real SIGINT to the process at the moment it starts importing a module; the
# modules are those imported during the main command's start-up
INTERRUPT_AT_IMPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # an interactive shell's Ctrl-C, whatever the runner inherited
target = sys.argv[1]
def hook(event, args):
    if event == "import" and args[0] == target:
        os.kill(os.getpid(), signal.SIGINT)
sys.addaudithook(hook)
from synth.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("module", ["typing", "numpy", "datetime", "z3", "synth.cli.solve", "yaml"])
def test_ctrl_c_during_start_up_is_one_line(module):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", INTERRUPT_AT_IMPORT, module, "--topology", "testbed-2x4",
                           "--axes", "dp=8"], env=env, capture_output=True, text=True, timeout=limit_s(120))
    assert (done.returncode, done.stderr, done.stdout) == (130, "synth-reduce: interrupted\n", "")


def test_the_held_interrupt_handler_is_restored(cli):
    # from Python's own handler, whatever the runner inherited (a background job of a non-interactive shell
    # ignores SIGINT, and the CLI then leaves it alone)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli("--topology", "testbed-2x4", "--axes", "dp=8", "--no-verify", "--top", "0")[0] == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
