"""Crafted MSCCL XMLs: every count a file declares is bounded before the
checker allocates anything for it, as the executor's reader bounds them
(msccl-executor-nccl c6f6b36d, src/include/msccl/msccl_parser.h: 4096
elements a rank keeps, 1024 children per element, 16 attributes; offsets
are 16-bit in the kernel's step, msccl_struct.h), and an over-limit file is
refused with the limit named, in bounded memory."""

from __future__ import annotations

import tracemalloc

import pytest

from synth.errors import SynthError
from synth.export.msccl_check import check_algorithm

STEP = ('      <step s="{s}" type="{t}" srcbuf="i" srcoff="{src}" dstbuf="o" dstoff="{dst}" cnt="1" depid="-1" '
        'deps="-1" hasdep="0"/>\n')


def _algo(ngpus: int = 2, nchunks: int = 2, extra: str = "") -> str:
    return (f'<algo name="x" proto="Simple" nchannels="1" nchunksperloop="{nchunks}" ngpus="{ngpus}" '
            f'coll="allreduce" inplace="1" outofplace="1" minBytes="0" maxBytes="0"{extra}>\n')


def _pair(steps_per_tb: int = 1, s_chunks: int = 0) -> str:
    """A 2-gpu all-reduce body: each gpu sends one chunk and receives the other, ``steps_per_tb`` times."""
    out = []
    for r in range(2):
        out.append(f'  <gpu id="{r}" i_chunks="2" o_chunks="2" s_chunks="{s_chunks}">\n')
        out.append(f'    <tb id="0" send="{1 - r}" recv="{1 - r}" chan="0">\n')
        for s in range(steps_per_tb):
            out.append(STEP.format(s=s, t="s", src=r, dst=-1))
        out.append("    </tb>\n  </gpu>\n")
    return "".join(out) + "</algo>\n"


def _refused(text: str) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(SynthError) as caught:
            check_algorithm(text, "crafted.xml")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20 + 4 * len(text), peak  # nothing allocated in proportion to a declared count
    message = str(caught.value)
    assert message.startswith("crafted.xml") and "\n" not in message
    return message


@pytest.mark.parametrize("attrs,message", [
    ({"ngpus": 10**9}, r"ngpus=1000000000: must be 1\.\.1024 \(one <gpu> per rank and the executor's reader holds "
                       r"at most 1024 children of <algo>\)"),
    ({"nchunks": 10**15}, r"nchunksperloop=1000000000000000: must be 1\.\.32838 \(step offsets are 16-bit"),
    ({"ngpus": 1024, "nchunks": 32838}, r"ngpus x nchunksperloop = 33626112: over this checker's limit of 65536"),
])
def test_huge_declared_counts_are_refused_at_the_algo_element(attrs, message):
    import re
    text = _algo(attrs.get("ngpus", 2), attrs.get("nchunks", 2)) + _pair()
    assert re.search(message, _refused(text))


def test_a_huge_scratch_buffer_is_refused():
    assert "s_chunks=1000000000: must be 0..32838" in _refused(_algo() + _pair(s_chunks=10**9))


def test_a_rank_reading_more_elements_than_the_executor_holds_is_refused():
    """A rank keeps <algo>, every <gpu>, its own <tb>s and <step>s: 4095 at
    most. 64 thread blocks of 63 steps on one gpu pass every per-element
    limit but not that one."""
    blocks = []
    for b in range(64):
        blocks.append(f'    <tb id="{b}" send="-1" recv="-1" chan="0">\n')
        blocks += [STEP.format(s=s, t="cpy", src=0, dst=0) for s in range(63)]
        blocks.append("    </tb>\n")
    text = (_algo() + '  <gpu id="0" i_chunks="2" o_chunks="2" s_chunks="0">\n' + "".join(blocks) + "  </gpu>\n"
            + '  <gpu id="1" i_chunks="2" o_chunks="2" s_chunks="0">\n  </gpu>\n</algo>\n')
    message = _refused(text)
    assert f"gpu 0 reads {1 + 2 + 64 + 64 * 63} elements" in message and "fewer than 4096" in message


def test_over_the_executors_step_count_and_attribute_limits():
    assert "65 steps; the executor allows 64 per thread block" in _refused(_algo() + _pair(steps_per_tb=65))
    many = "".join(f' x{n}="0"' for n in range(8))  # 9 + 8 attributes on <algo>
    assert "more than 16 attributes" in _refused(_algo(extra=many) + _pair())
    assert "over 254 characters" in _refused(_algo(extra=f' name2="{"a" * 300}"') + _pair())


def test_an_offset_past_16_bits_is_refused():
    text = (_algo(ngpus=1, nchunks=32838) + '  <gpu id="0" i_chunks="32838" o_chunks="32838" s_chunks="0">\n'
            '    <tb id="0" send="-1" recv="-1" chan="0">\n' + STEP.format(s=0, t="cpy", src=32768, dst=0)
            + "    </tb>\n  </gpu>\n</algo>\n")
    assert "offset 32768 in i: the executor stores offsets in 16 bits (at most 32767)" in _refused(text)
