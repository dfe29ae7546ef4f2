"""The reduction language: AST (frozen dataclasses), printer and lark parser.

``parse_program(format_program(p)) == p`` for every program ``p``. Level names are
those of the synthesis hierarchy (from the topology) plus ``root`` for the top;
they are resolved against a hierarchy by :mod:`synth.synthesis.semantics`.

lark is imported only when text that is not in the printer's canonical form is
parsed: :func:`read_program` reads what :func:`format_program` prints with a
strict pattern, so loading a plan for execution does not load the parser.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..caches import memoised
from ..errors import SynthError
from ..resources import grammar_path

if TYPE_CHECKING:
    import lark

ROOT = "root"


class Collective(enum.Enum):
    ALLREDUCE = "AllReduce"
    REDUCESCATTER = "ReduceScatter"
    ALLGATHER = "AllGather"
    REDUCE = "Reduce"
    BROADCAST = "Broadcast"

    __hash__ = object.__hash__  # members are singletons; Enum's hash is slow Python

    @classmethod
    def from_text(cls, text: str) -> "Collective":
        for c in cls:
            if c.value.lower() == text.lower():
                return c
        raise SynthError(f"unknown collective '{text}'; use one of {', '.join(c.value for c in cls)}")


class Form(enum.Enum):
    INSIDE = "inside"
    PARALLEL = "parallel"
    MASTER = "master"

    __hash__ = object.__hash__


@dataclass(frozen=True)
class Instruction:
    """``collective(level, form)``; ``ancestor`` is set for parallel and master."""

    collective: Collective
    level: str
    form: Form
    ancestor: str | None = None

    def __post_init__(self) -> None:
        if (self.form is Form.INSIDE) != (self.ancestor is None):
            raise ValueError("parallel/master need an ancestor; inside takes none")

    def __str__(self) -> str:
        form = self.form.value if self.ancestor is None else f"{self.form.value}({self.ancestor})"
        return f"{self.collective.value}({self.level}, {form})"


@dataclass(frozen=True)
class Program:
    instructions: tuple[Instruction, ...]

    def __len__(self) -> int:
        return len(self.instructions)

    def __str__(self) -> str:
        return format_program(self)


def format_program(program: Program, sep: str = "\n") -> str:
    """Text form: one instruction per line (or joined by ``sep``)."""
    return sep.join(str(i) for i in program.instructions)


@memoised(maxsize=1)
def _parser() -> "lark.Lark":
    import lark

    return lark.Lark(grammar_path("program.lark").read_text(), parser="lalr", propagate_positions=True)


def _instruction(tree: "lark.Tree") -> Instruction:
    collective, level, form = tree.children
    ancestor = str(form.children[1]) if form.data != "inside" else None
    return Instruction(Collective.from_text(str(collective)), str(level), Form(form.data), ancestor)


_CANONICAL = re.compile(
    r"(AllReduce|ReduceScatter|AllGather|Reduce|Broadcast)\(([A-Za-z_]\w*), "
    r"(?:(inside)|(parallel|master)\(([A-Za-z_]\w*)\))\)"
)
_BY_NAME = {c.value: c for c in Collective}


def read_program(text: str, source: str = "<program>") -> Program:
    """:func:`parse_program`, with a fast path (no lark) for the canonical text
    :func:`format_program` prints: one instruction per line, exactly as printed."""
    instructions = []
    for line in text.split("\n"):
        m = _CANONICAL.fullmatch(line)
        if m is None:
            return parse_program(text, source)
        collective, level, inside, form, ancestor = m.groups()
        instructions.append(
            Instruction(_BY_NAME[collective], level, Form.INSIDE if inside else Form(form), ancestor)
        )
    return Program(tuple(instructions))


def parse_program(text: str, source: str = "<program>") -> Program:
    """Parse program text; errors report ``source:line:column``."""
    import lark

    try:
        tree = _parser().parse(text)
    except lark.UnexpectedInput as exc:
        line, column = exc.line, exc.column
        if isinstance(exc, lark.UnexpectedToken):
            found = repr(str(exc.token))
            if exc.token.type == "$END":  # point just past the last character
                found = "end of input"
                line = text.count("\n") + 1
                column = len(text.rsplit("\n", 1)[-1]) + 1
            expected = ", ".join(sorted(_describe(t) for t in exc.expected))
            what = f"unexpected {found}; expected {expected}"
        elif isinstance(exc, lark.UnexpectedCharacters):
            what = f"unexpected character {exc.char!r}"
        else:
            what = "unexpected end of input"
        raise SynthError(f"{source}:{line}:{column}: syntax error: {what}") from None
    return Program(tuple(_instruction(t) for t in tree.children if isinstance(t, lark.Tree)))


_TERMINAL_NAMES = {
    "COLLECTIVE": "a collective (AllReduce, ReduceScatter, AllGather, Reduce, Broadcast)",
    "NAME": "a level name",
    "INSIDE": "inside",
    "PARALLEL": "parallel(LEVEL)",
    "MASTER": "master(LEVEL)",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "NEWLINE": "a new line",
    "SEMICOLON": "';'",
    "$END": "end of input",
}


def _describe(terminal: str) -> str:
    return _TERMINAL_NAMES.get(terminal, terminal)
