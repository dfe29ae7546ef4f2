"""The program text form: grammar, printer, round-trip, errors with line and column."""

import itertools

import pytest

from synth.errors import SynthError
from synth.synthesis.language import Collective, Form, Instruction, Program, format_program, parse_program


def test_parse_blueconnect_with_comments_and_separators():
    text = """
    # BlueConnect
    ReduceScatter(node, inside)   # inside each node
    allreduce(node, PARALLEL(root)); AllGather(node, inside)
    """
    p = parse_program(text)
    assert p == Program((
        Instruction(Collective.REDUCESCATTER, "node", Form.INSIDE),
        Instruction(Collective.ALLREDUCE, "node", Form.PARALLEL, "root"),
        Instruction(Collective.ALLGATHER, "node", Form.INSIDE),
    ))
    assert format_program(p) == (
        "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"
    )


def test_round_trip_over_all_instruction_shapes():
    levels = ["root", "rack", "node", "gpu"]
    instructions = []
    for c, level in itertools.product(Collective, levels):
        instructions.append(Instruction(c, level, Form.INSIDE))
        for anc in levels[: levels.index(level)]:
            instructions.append(Instruction(c, level, Form.PARALLEL, anc))
            instructions.append(Instruction(c, level, Form.MASTER, anc))
    for n in range(0, len(instructions), 7):
        p = Program(tuple(instructions[n : n + 5]))
        assert parse_program(format_program(p)) == p
        assert parse_program(format_program(p, " ; ")) == p


@pytest.mark.parametrize(
    "text,where,what",
    [
        ("AllReduce(node inside)", "1:16", "expected ','"),
        ("AllReduce(node, parallel)", "1:25", "expected '('"),
        ("Sum(node, inside)", "1:1", "unexpected 'Sum'"),
        ("AllReduce(node, inside)\nAllGather(node, $)", "2:17", "unexpected character '$'"),
        ("AllReduce(node, inside) AllGather(node, inside)", "1:25", "expected ';', a new line"),
        ("AllReduce(node, inside", "1:23", "unexpected end of input"),
    ],
)
def test_parse_errors_report_line_and_column(text, where, what):
    with pytest.raises(SynthError) as err:
        parse_program(text, "prog.txt")
    assert f"prog.txt:{where}: syntax error" in str(err.value)
    assert what in str(err.value)


def test_empty_program_parses_to_no_instructions():
    assert parse_program("# nothing\n\n") == Program(())


def test_instruction_needs_ancestor_exactly_for_parallel_and_master():
    with pytest.raises(ValueError):
        Instruction(Collective.ALLREDUCE, "node", Form.PARALLEL)
    with pytest.raises(ValueError):
        Instruction(Collective.ALLREDUCE, "node", Form.INSIDE, "root")
