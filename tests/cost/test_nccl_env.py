"""NCCL's choice variables on a corpus line: NCCL_ALGO lists the algorithms and
NCCL_PROTO the protocols NCCL may choose from (NCCL's env.html), so a run under
them is priced with what they allow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from synth.cost import NetworkProfile
from synth.cost.calibration import corpus_samples
from synth.cost.corpus import RUN_ENVIRONMENT, call_from_dict, read_corpus, with_environment
from synth.cost.fit import call_samples
from synth.cost.nccl import choose, comm_of
from synth.errors import SynthError
from synth.synthesis.language import Collective
from synth.topology import load_topology

LINE = {"set": "t", "source": "s", "system": {}, "collective": "allreduce", "size_bytes": 8, "ranks": 16,
        "time_us": 100.0}


def _call(env):
    return call_from_dict({**LINE, "env": env}, "t.jsonl:1")


def test_nccl_algo_and_proto_lists_as_nccl_reads_them():
    call = _call({"NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple"})
    assert (call.allowed, call.protocols) == (("ring", "tree"), ("Simple",))
    assert _call({"NCCL_PROTO": "^LL"}).protocols == ("LL128", "Simple")  # ^: all but these
    assert _call({"NCCL_ALGO": "nvls,NVLSTree"}).allowed == ("nvls", "nvlstree")  # any case
    assert _call({}).allowed is None and _call({}).protocols is None
    assert call_from_dict({**LINE, "proto": "LL128"}, "t.jsonl:1").protocols == ("LL128",)  # the format's field
    forced = call_from_dict({**LINE, "algo": "Ring", "env": {"NCCL_ALGO": "Ring,Tree"}}, "t.jsonl:1")
    assert (forced.algo, forced.allowed) == ("ring", None)  # the line's forced algorithm wins


@pytest.mark.parametrize("env, message", [({"NCCL_PROTO": "Fast"}, "NCCL_PROTO='Fast'"),
                                          ({"NCCL_PROTO": "^LL,LL128,Simple"}, "leaves nothing"),
                                          ({"NCCL_ALGO": "Star"}, "NCCL_ALGO='Star'")])
def test_unknown_names_are_errors_naming_the_variable(env, message):
    with pytest.raises(SynthError, match=message):
        _call(env)


def test_a_small_call_under_simple_only_runs_simple():
    a3 = load_topology("a3-mega")
    comm = comm_of(a3, tuple(range(16)))
    free = choose(comm, Collective.ALLREDUCE, 8.0)
    assert free.protocol == "LL"  # what NCCL picks for 8 bytes across nodes with every protocol allowed
    ring_tree = choose(comm, Collective.ALLREDUCE, 8.0, ("ring", "tree"), protocols=("Simple",))
    assert ring_tree.protocol == "Simple" and ring_tree.algorithm in ("ring", "tree")
    big = choose(comm, Collective.ALLREDUCE, 2.0**24, ("ring", "tree"), protocols=("Simple",))
    assert big.algorithm != "nvlstree" and choose(comm, Collective.ALLREDUCE, 2.0**24).algorithm == "nvlstree"


def test_the_step_cost_prices_the_restricted_choice(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({**LINE, "env": {"NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple"}}) + "\n"
                    + json.dumps(LINE) + "\n")
    calls, _ = read_corpus(path)
    a3 = load_topology("a3-mega")
    prior = NetworkProfile.prior(a3)
    restricted, free = (s.features(prior) for s in call_samples(calls, a3))
    assert set(restricted.base_count) <= {"ring.Simple", "tree.Simple"}
    assert not set(free.base_count) & {"ring.Simple", "tree.Simple"}


def test_the_tcpxo_run_is_priced_under_its_profile():
    data = Path(__file__).resolve().parents[2] / "data" / "nccl"
    env = RUN_ENVIRONMENT["a3mega-2x8-allreduce"]
    sets = corpus_samples(data)
    samples = sets["a3mega-2x8-allreduce"]
    assert all(s.call.protocols == ("Simple",) and not s.call.nvls_enabled for s in samples)
    prior = NetworkProfile.prior(samples[0].topology)
    keys = {k for s in samples for k in s.features(prior).base_count}
    assert keys <= {"ring.Simple", "tree.Simple"} and env["NCCL_PROTO"] == "Simple"
    assert with_environment(samples[0].call, {}, "x") == samples[0].call  # no variables: unchanged
    calls, _ = read_corpus(data / "a3mega-2x8-allreduce.jsonl")  # what validate and fit read: the same
    assert [c.protocols for c in calls] == [("Simple",)] * len(samples)
    assert np.isfinite([s.median_s for s in samples]).all()
