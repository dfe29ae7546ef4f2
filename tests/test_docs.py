"""The repository's documents stand alone and say what is.

Nothing in docs/, README.md or synth/ points outside the repository (to
``../shared/`` or a design brief a clone does not have), and none reads as a
work log: no dated entries, no rounds or sessions of work, no issue numbers of
this project, no commit hashes of it. Upstream sources cited as such (an
NVIDIA/nccl commit, a PyTorch issue) are fine: a match is allowed when an
upstream project is named just before it. docs/results.md is generated from
measurement records, so its provenance lines (when and on which code the data
were measured) are allowed too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

ORDINALS = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|last|next|previous|earlier|later)"

# what a work log or an outside pointer looks like -> why it is refused
RULES = {
    r"\.\./shared\b|\bshared/DESIGN": "points to ../shared/, which a clone does not have",
    r"\bDESIGN\.md\b|\b(?:the|design) brief\b": "cites the design brief, not the project's own docs",
    r"\b20\d\d-[01]\d-[0-3]\d\b": "a dated entry",
    rf"\b{ORDINALS} round\b|\bround \d+\b": "a round of work",
    rf"\b{ORDINALS} session\b|\b(?:a|the|this|that) session\b": "a session of work",
    r"\b[Ii]ssues? #?\d+|(?<![\"'])#\d{2,}\b": "an issue number",  # not a colour such as "#777777"
    r"\bitems? \d+\b": "a numbered item of an issue",
    r"\b[Cc]ommits? `?[0-9a-f]{7,40}\b|\b(?:at|before|after|since) `?[0-9a-f]{7,12}`?(?=[\s),.;:]|$)":
        "a commit hash",
}

# an upstream project named shortly before a match makes it a citation of that project
UPSTREAM = re.compile(
    r"github\.com|\b[A-Za-z][\w.-]*/[A-Za-z][\w.-]*\b(?<!\.md)|msccl-executor-nccl|msccl-tools|nccl-tests|NCCL|"
    r"MSCCL|RCCL|PyTorch|pytorch|torchtitan|Megatron|FBGEMM|OpenMPI|Open MPI|PRRTE|mpi4py|CuPy|JAX|jax")
NEAR = 100  # characters before a match in which the upstream project must be named

# docs/results.md is generated (scripts/evaluation_report.py): the data's provenance
GENERATED = {
    "docs/results.md": re.compile(r"measured on \d{4}-\d\d-\d\d \d\d:\d\d UTC|commit [0-9a-f]{7,}\); do not edit|"
                                  r"^\| [^|]+ \| \d{4}-\d\d-\d\d \|"),
}


def documents() -> list[Path]:
    """The files a user reads: README.md, docs/*.md and synth/'s Python sources."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "synth").rglob("*.py"))]


def findings(path: Path, text: str) -> list[str]:
    """Each line of ``text`` that breaks a rule, as ``path:line: why: text``."""
    rel = path.relative_to(REPO).as_posix()
    generated = GENERATED.get(rel)
    out = []
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        for pattern, why in RULES.items():
            for m in re.finditer(pattern, line):
                if generated is not None and generated.search(line):
                    continue
                before = line[:m.start()]
                if len(before) < NEAR and n > 1:
                    before = lines[n - 2] + " " + before
                if why not in ("points to ../shared/, which a clone does not have",
                               "cites the design brief, not the project's own docs") and UPSTREAM.search(before[-NEAR:]):
                    continue  # an upstream source, cited as such
                out.append(f"{rel}:{n}: {why}: {line.strip()[:120]}")
    return out


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_documents_stand_alone_and_read_as_what_is(path):
    found = findings(path, path.read_text())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("text, why", [
    ("the design brief is `../shared/DESIGN.md`", "points to ../shared/"),
    ("taken where the brief is silent", "design brief"),
    ("### Positions in the state ids (2026-11-27)", "a dated entry"),
    ("the seventh round's tests", "a round of work"),
    ("measured in this session", "a session of work"),
    ("AllGather of members that hold nothing (issue 12, item 15)", "an issue number"),
    ("Made cheaper in commit 6d5e263", "a commit hash"),
    ("measured after 1fa470e, the review", "a commit hash"),
])
def test_the_rules_catch_a_work_log(text, why):
    found = findings(REPO / "docs" / "example.md", text)
    assert found and why in found[0], found


@pytest.mark.parametrize("text", [
    "Format followed: NVIDIA/nccl at commit 5067397c (2026-06-11), plugins/tuner/example/plugin.c",
    "msccl-executor-nccl at commit c6f6b36d1a4c7ae44916fcc5c8e32c95cce2ae54",
    "a round of concurrent flows; rounds of `S/m` to the next member",
    "OpenMPI's session directories",
    "PyTorch issue 12345 describes the hang",
])
def test_upstream_citations_and_technical_words_pass(text):
    assert findings(REPO / "docs" / "example.md", text) == []


# ---------------------------------------------------------------- the README's counts

def _flat(text: str) -> str:
    """``text`` with its line breaks as spaces (a stated count may wrap)."""
    return " ".join(text.split())


def _stated(pattern: str, text: str) -> tuple[str, ...]:
    found = re.search(pattern, _flat(text))
    assert found, f"no statement matching {pattern!r}"
    return found.groups()


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _corpus() -> tuple[int, int, int]:
    """(sets, sources, lines) of data/nccl/, read from the files: a set is a line's
    ``set``; its source is the repository its ``source`` names (a commit-pinned
    github.com URL, or ``owner/repo#issue``)."""
    import json

    sets: dict[str, str] = {}
    lines = 0
    for path in sorted((REPO / "data" / "nccl").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                doc = json.loads(line)
                sets.setdefault(doc["set"], doc["source"])
                lines += 1
    sources = set()
    for source in sets.values():
        found = re.search(r"github\.com/([^/]+/[^/#]+)", source) or re.match(r"([\w.-]+/[\w.-]+)#", source)
        sources.add(found.group(1) if found else source)
    return len(sets), len(sources), lines


def test_the_readme_states_the_corpus_it_ships():
    sets, sources, lines = _corpus()
    readme = (REPO / "README.md").read_text()
    assert tuple(map(_number, _stated(r"`data/nccl/`, (\d+) sets from (\d+) sources", readme))) == (sets, sources)
    simulator = (REPO / "docs" / "simulator.md").read_text()
    stated = _stated(r"`data/nccl/` holds (\d+) public measurement sets .*? from (\d+) sources \(.*?(\d+) lines",
                     simulator)
    assert tuple(map(_number, stated)) == (sets, sources, lines)


def test_the_readme_names_every_shipped_topology():
    files = {p.stem for p in (REPO / "topologies").glob("*.yaml")}
    readme = _flat((REPO / "README.md").read_text())
    paragraph = readme[readme.index("Topologies are given as a path"):]
    paragraph = paragraph[:paragraph.index("comments).")]
    (count,) = _stated(r"one of the (\d+) shipped files in `topologies/`", paragraph)
    named = set(re.findall(r"`([\w.-]+)`", paragraph)) - {"topologies/"}
    assert _number(count) == len(files)
    assert named == files, f"named but not shipped: {sorted(named - files)}; shipped but not named: {sorted(files - named)}"


def test_the_readme_states_how_many_models_ship():
    (count,) = _stated(r"one of the (\d+) shipped models in `models/`", (REPO / "README.md").read_text())
    assert _number(count) == len(list((REPO / "models").glob("*.yaml")))


def _collected() -> int:
    """How many tests ``pytest --collect-only`` finds in tests/ (one process)."""
    import subprocess
    import sys

    from processes import limit_s

    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                           "tests"], cwd=REPO, capture_output=True, text=True, timeout=limit_s(240))
    found = re.search(r"(\d+) tests? collected", done.stdout)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    return int(found.group(1))


BAND = 0.15  # tests are added all the time: a stated "about N" holds within 15% of the count


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_stated_test_counts_are_about_right():
    collected = _collected()
    for doc, pattern in (("README.md", r"about ([\d,]+) tests"), ("docs/performance.md", r"About ([\d,]+) tests")):
        (stated,) = _stated(pattern, (REPO / doc).read_text())
        assert abs(_number(stated) - collected) <= BAND * collected, (
            f"{doc} states about {stated} tests; {collected} are collected: state a round figure near it")


def test_the_readme_quotes_the_generated_accuracy_report():
    """The README's summary of the NCCL accuracy is the report's own numbers
    (docs/simulator.md's section written by scripts/nccl_accuracy.py)."""
    simulator = (REPO / "docs" / "simulator.md").read_text()
    table = simulator[simulator.index("| set | topology | NCCL rules |"):]
    table = table[:table.index("\n\n")]
    evaluated = len(table.split("\n")) - 2  # less the header and its rule
    by_size = re.search(r"^\| held out by size \| (\d+)% \(\d+ calls\) \| (\d+)% \(\d+ calls\) \|$", simulator, re.M)
    assert by_size, "no 'held out by size' row in docs/simulator.md"
    readme = (REPO / "README.md").read_text()
    (sets,) = _stated(r"PyTorch measurements of (\d+) sets on", readme)
    small, large = _stated(r"within (\d+)% \(< 1 MiB\) and (\d+)% \(>= 64 MiB\)", readme)
    assert _number(sets) == evaluated
    assert (small, large) == by_size.groups()
    # the never-seen figure (leave one repository out) comes first, as the report states it
    never = re.search(r"^Never seen: multi-node sources: (\d+) of (\d+) within 25%, median \d+%, worst (\d+)%.*"
                      r"all calls (\d+)%\.$", simulator, re.M)
    assert never, "no 'Never seen:' summary line in docs/simulator.md"
    overall, within, multi, worst = _stated(r"never seen .*? within a median (\d+)% over all calls \((\d+) of (\d+) "
                                            r"multi-node sources within 25%, the worst (\d+)%\)", readme)
    assert (within, multi, worst, overall) == never.groups()
    flat = _flat(readme)
    assert flat.index("never seen") < flat.index("(< 1 MiB)"), "the never-seen figure is stated first"
