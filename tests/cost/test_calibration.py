"""The shipped calibration (synth.cost.calibration, synth.cost.shared): the shared parameters fitted
on the whole public corpus, regenerated here from data/nccl/, and used by every
NCCL prediction unless a profile or ``--profile prior`` is given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from synth.cost import Algorithm, Model, NetworkProfile
from synth.cost.calibration import CORPUS_SETS, NOT_FITTED, corpus_samples, fit_corpus
from synth.cost.shared import load_calibration, shipped, shipped_path
from synth.cost.fit import predict_all
from synth.cost.transfer import SharedParameters
from synth.errors import SynthError
from synth.topology import load_topology

DATA = Path(__file__).resolve().parents[2] / "data" / "nccl"


def _numbers(p: SharedParameters) -> list[float]:
    d = p.to_dict()
    groups = ("achieved", "tool_overhead_us", "base_latency_us", "efficiency")
    return [v for group in groups for v in d[group].values()] + [v for row in d["step_latency_us"].values()
                                                                 for v in row.values()]


def test_the_shipped_file_is_what_the_corpus_fits():
    """Refit data/nccl/ and compare with the shipped parameters (rounded to 6
    digits when shipped; the fit's own arithmetic may differ in the last)."""
    refitted = fit_corpus(DATA)
    assert _numbers(refitted) == pytest.approx(_numbers(shipped()), rel=1e-3, abs=1e-6)
    doc = json.loads(shipped_path().read_text())
    assert doc["fitted_on"]["sets"] == sorted(corpus_samples(DATA))


def test_every_corpus_set_has_a_topology_or_a_reason():
    names = {p.stem for p in DATA.glob("*.jsonl")}
    assert names == set(CORPUS_SETS) | set(NOT_FITTED)
    assert not set(CORPUS_SETS) & set(NOT_FITTED)


def test_the_default_model_prices_with_the_shipped_calibration():
    p5 = load_topology("p5")
    assert Model().profile_for(p5) == shipped().profile_for(p5)
    assert Model.load("ring").profile_for(p5) == shipped().profile_for(p5)
    assert Model.load("nccl", "prior").profile_for(p5) == NetworkProfile.prior(p5)  # --profile prior: NCCL's constants
    assert Model(Algorithm.MPI).profile_for(p5) == NetworkProfile.prior(p5)  # the CPU testbed's model is not NCCL's
    # the calibration moves the network: the first EFA generation's achieved fraction scales p4d's stated 12.5 GB/s
    # (p5's EFAv2 never bounds a corpus call: its NVLS Tree's NVLink part does, so its fraction stays the prior's)
    p4d = load_topology("p4d")
    achieved = dict(shipped().achieved)["efa"]
    assert Model().profile_for(p4d).bandwidth_GBps[0] == pytest.approx(12.5 * achieved)
    assert achieved != 1.0 and dict(shipped().achieved)["efa2"] == 1.0
    assert "shipped calibration" in Model().describe() and "priors" in Model.load("nccl", "prior").describe()


def test_a_profile_and_the_prior_are_exclusive():
    with pytest.raises(SynthError, match="not both"):
        Model(profile=NetworkProfile.prior(load_topology("p5")), prior=True)


def test_a_damaged_calibration_is_refused(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"schema": "synth-reduce/calibration", "version": 1, "parameters": {"achieved": {}}}))
    with pytest.raises(SynthError, match="not valid calibration parameters"):
        load_calibration(path)
    path.write_text(json.dumps({"schema": "synth-reduce/calibration", "version": 9}))
    with pytest.raises(SynthError, match="version 9 is not supported"):
        load_calibration(path)


def _validate_error(cli, *extra) -> float:
    code, out, err = cli("validate", str(DATA / "aws-p5-2x8-allreduce.jsonl"), "--topology", "p5", "--json", *extra)
    assert code == 0, err
    return json.loads(out)["median_rel_error"]


def test_validate_uses_the_shipped_calibration_unless_profile_prior(cli):
    p5 = load_topology("p5")
    samples = corpus_samples(DATA)["aws-p5-2x8-allreduce"]
    measured = np.array([s.median_s for s in samples])

    def median_error(profile: NetworkProfile) -> float:
        return float(np.median(np.abs(predict_all(profile, samples) - measured) / measured))

    assert _validate_error(cli) == pytest.approx(median_error(shipped().profile_for(p5)), rel=1e-9)
    assert _validate_error(cli, "--profile", "prior") == pytest.approx(median_error(NetworkProfile.prior(p5)), rel=1e-9)
    assert median_error(shipped().profile_for(p5)) != median_error(NetworkProfile.prior(p5))


def test_profile_prior_on_the_main_command(cli):
    args = ("--topology", "p2-a100", "--axes", "dp=4,mp=16", "--reduce", "dp", "--no-verify", "--top", "1")
    code, out, err = cli(*args, "--profile", "prior")
    assert code == 0, err
    assert "topology's numbers as priors" in out
    code, shipped_out, err = cli(*args)
    assert code == 0, err
    assert "shipped calibration" in shipped_out and "priors" not in shipped_out
    prior = json.loads(cli(*args, "--profile", "prior", "--json")[1])["placements"][0]["default"]["predicted_s"]
    calibrated = json.loads(cli(*args, "--json")[1])["placements"][0]["default"]["predicted_s"]
    assert prior != calibrated


def test_a_forced_algorithm_keeps_the_models_parameters():
    p5 = load_topology("p5")
    assert Model(prior=True).with_algorithm(Algorithm.RING).profile_for(p5) == NetworkProfile.prior(p5)
    assert Model().with_algorithm(Algorithm.TREE).profile_for(p5) == shipped().profile_for(p5)
