"""Topology files: the shipped ones load with their documented shape, and bad files
give one SynthError that names the file, the field and the fix (never a traceback)."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from synth.errors import SynthError
from synth.resources import topologies_dir
from synth.topology import (
    RESERVED_NAMES,
    Level,
    load_topology,
    parse_scale,
    resolve_topology_path,
    topology_from_dict,
)

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- shipped topologies

# name -> [(level name, count)], outermost first, as documented in the files
SHIPPED = {
    "dgx-a100": [("node", 16), ("gpu", 8)],
    "dgx-h100": [("node", 16), ("gpu", 8)],
    "dgx-h800": [("node", 256), ("gpu", 8)],  # DeepSeek-V3's 2,048 H800s
    "p2-a100": [("node", 4), ("gpu", 16)],
    "p2-v100": [("node", 4), ("gpu", 8)],
    "rack": [("rack", 2), ("node", 4), ("cpu", 2), ("gpu", 4)],
    "testbed-2x4": [("node", 2), ("rank", 4)],
    "testbed-4x4": [("node", 4), ("rank", 4)],
    "testbed-2x2x2": [("rack", 2), ("node", 2), ("rank", 2)],
    # the measured systems of the NCCL calibration corpus (data/nccl/)
    "a3-high": [("node", 2), ("gpu", 8)],
    "a3-mega": [("node", 2), ("gpu", 8)],
    "gb200-nvl72": [("gpu", 72)],
    "gcp-a4": [("node", 2), ("gpu", 8)],
    "hgx-h200": [("gpu", 8)],
    "p4de": [("node", 2), ("gpu", 8)],
    "p5": [("node", 2), ("gpu", 8)],
    "p6-b200": [("node", 4), ("gpu", 8)],
    "oci-bm-gpu4-8": [("node", 2), ("gpu", 8)],
    "gke-a3ultra-1gpu1nic": [("node", 2), ("gpu", 1)],
    "gcp-a3-ultra": [("node", 2), ("gpu", 8)],
    "gcp-a3-high-tcp1": [("node", 2), ("gpu", 8)],
    "together-b200-ib": [("node", 64), ("gpu", 8)],
    "p3dn": [("node", 8), ("gpu", 8)],
    "p4d": [("node", 2), ("gpu", 8)],
    "abci-v": [("node", 32), ("gpu", 4)],
    "abci-a": [("node", 16), ("gpu", 8)],
}
# name -> (NICs per node, GB/s per NIC, NVLinks per GPU, NVLS, compute capability), as each file's comments source them
NCCL_FACTS = {
    "dgx-a100": (8, 24.0, 12, False, 8.0),
    "dgx-h100": (8, 47.0, 18, True, 9.0),
    "p5": (8, 50.0, 18, True, 9.0),
    "a3-mega": (8, 25.0, 18, True, 9.0),
    "a3-high": (4, 25.0, 18, True, 9.0),
    "p6-b200": (8, 50.0, 18, True, 10.0),
    "gcp-a4": (8, 50.0, 18, True, 10.0),
    "p4de": (4, 12.5, 12, False, 8.0),  # 4 EFA NICs (aws-ofi-nccl topology/p4de-24xl-topo.xml)
    "hgx-h200": (None, None, 18, True, 9.0),
    "gb200-nvl72": (None, None, 18, True, 10.0),
    "oci-bm-gpu4-8": (16, 12.5, 12, False, 8.0),
    "gke-a3ultra-1gpu1nic": (1, 47.68, 18, False, 9.0),
    "gcp-a3-ultra": (8, 50.0, 18, True, 9.0),
    "gcp-a3-high-tcp1": (1, 25.0, 18, True, 9.0),
    "together-b200-ib": (8, 50.0, 18, True, 10.0),
    "p3dn": (1, 12.5, 6, False, 7.0),
    "p4d": (4, 12.5, 12, False, 8.0),
    "abci-v": (2, 12.5, 6, False, 7.0),
    "abci-a": (4, 25.0, 12, False, 8.0),
}


def test_shipped_set_is_exactly_the_documented_one():
    assert sorted(p.stem for p in topologies_dir().glob("*.yaml")) == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_topology_loads_with_documented_levels(name):
    topo = load_topology(name)
    assert topo.name == name
    assert [(lv.name, lv.count) for lv in topo.levels] == SHIPPED[name]
    assert topo.num_devices == math.prod(c for _, c in SHIPPED[name])
    assert topo.description  # every shipped file says what it models
    for lv in topo.levels:
        assert lv.bandwidth_GBps > 0 and lv.latency_us >= 0 and lv.ports >= 1


def test_p2_a100_facts():
    node, gpu = load_topology("p2-a100").levels
    assert (node.bandwidth_GBps, node.ports, node.fabric) == (8.0, 1, "switch")  # one shared NIC
    assert (gpu.bandwidth_GBps, gpu.fabric) == (270.0, "switch")  # NVSwitch, 90% of 300
    assert load_topology("p2-a100").num_devices == 64


def test_p2_v100_gpus_form_a_ring():
    topo = load_topology("p2-v100")
    node, gpu = topo.levels
    assert topo.counts == (4, 8) and topo.num_devices == 32
    assert gpu.fabric == "ring" and gpu.bandwidth_GBps == 135.0
    assert node.fabric == "switch" and node.bandwidth_GBps == 8.0 and node.ports == 1


def test_dgx_nodes_have_one_nic_per_gpu_rail():
    a100 = load_topology("dgx-a100").levels[0]
    h100 = load_topology("dgx-h100").levels[0]
    assert (a100.ports, a100.bandwidth_GBps) == (8, 24.0)
    assert h100.ports == 8 and 46.0 <= h100.bandwidth_GBps <= 49.0


@pytest.mark.parametrize("name", sorted(NCCL_FACTS))
def test_measured_systems_state_what_the_nccl_model_needs(name):
    topo = load_topology(name)
    nics, nic_GBps, nvlinks, nvls, cc = NCCL_FACTS[name]
    gpu = topo.levels[-1]
    # V100 nodes without an NVSwitch (cube-mesh p3dn, ABCI's 4-GPU mesh) are rings, as P2 models p2-v100
    assert topo.link(len(topo.levels) - 1) == "nvlink" and gpu.fabric == ("ring" if cc == 7.0 else "switch")
    assert (gpu.nvlinks, gpu.nvls, topo.compute_capability) == (nvlinks, nvls, cc)
    if nics is None:
        assert len(topo.levels) == 1  # one node whose network the sources do not state
    else:
        node = topo.levels[0]
        assert topo.link(0) == "net" and (node.ports, node.bandwidth_GBps) == (nics, nic_GBps)
    # NVLink 2: 6 x 25 = 150 GB/s per direction, NVLink 3: 300, NVLink 4: 450, NVLink 5: 900 (stas00's NVLink table)
    assert gpu.bandwidth_GBps == {7.0: 150.0, 8.0: 300.0, 9.0: 450.0, 10.0: 900.0}[cc] or name == "dgx-a100"


def test_links_of_the_p2_and_rack_topologies():
    p2 = load_topology("p2-a100")
    assert [p2.link(i) for i in range(2)] == ["net", "nvlink"] and p2.compute_capability == 8.0
    rack = load_topology("rack")
    assert [rack.link(i) for i in range(4)] == ["net", "net", "pcie", "pcie"]
    testbed = load_topology("testbed-2x4")  # the defaults: net outside, nvlink innermost, compute capability 8.0
    assert [testbed.link(i) for i in range(2)] == ["net", "nvlink"] and testbed.compute_capability == 8.0


def test_structure_is_everything_but_the_link_numbers():
    base = load_topology("dgx-h100")
    faster = replace(base, levels=(replace(base.levels[0], bandwidth_GBps=99.0, latency_us=0.5), base.levels[1]))
    assert faster.structure == base.structure
    assert base.scaled({"node": 2}).structure != base.structure
    no_nvls = replace(base, levels=(base.levels[0], replace(base.levels[1], nvls=False)))
    assert no_nvls.structure != base.structure
    assert base.describe_structure() == ("node x16 (ports 8, net) > gpu x8 (nvlink, 18 nvlinks, nvls), "
                                         "compute capability 9")


def test_rack_has_four_levels_and_64_devices():
    topo = load_topology("rack")
    assert topo.level_names == ("rack", "node", "cpu", "gpu")
    assert topo.counts == (2, 4, 2, 4)
    assert topo.num_devices == 64


# ---------------------------------------------------------------- loading by name or path


def test_load_by_name_with_and_without_suffix_and_by_path():
    by_name = load_topology("p2-a100")
    assert load_topology("p2-a100.yaml") == by_name
    assert load_topology(str(REPO / "topologies" / "p2-a100.yaml")) == by_name
    assert resolve_topology_path("p2-a100").name == "p2-a100.yaml"


def test_a_path_wins_over_a_shipped_name(tmp_path, monkeypatch):
    (tmp_path / "p2-a100").write_text(
        "name: mine\nlevels:\n  - {name: node, count: 3, bandwidth_GBps: 1, latency_us: 1}\n"
    )
    monkeypatch.chdir(tmp_path)
    assert load_topology("p2-a100").name == "mine"


def test_unknown_topology_lists_the_shipped_ones():
    with pytest.raises(SynthError) as info:
        load_topology("no-such-cluster")
    msg = str(info.value)
    assert "no-such-cluster" in msg and "not found" in msg
    for name in SHIPPED:
        assert name in msg


def test_defaults_and_name_from_file_stem(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text("levels:\n  - name: node\n    count: 2\n    bandwidth_GBps: 3\n    latency_us: 0\n")
    topo = load_topology(str(path))
    assert topo.name == "mini"  # no 'name': the file stem
    assert topo.levels == (Level("node", 2, 3.0, 0.0, ports=1, fabric="switch"),)
    assert isinstance(topo.levels[0].bandwidth_GBps, float)  # ints are accepted as numbers


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_to_dict_round_trips(name):
    topo = load_topology(name)
    assert topology_from_dict(topo.to_dict(), "x") == topo


# ---------------------------------------------------------------- scaling


def test_scaled_overrides_counts_and_keeps_the_rest():
    base = load_topology("p2-a100")
    small = base.scaled({"node": 2})
    assert small.counts == (2, 16) and small.num_devices == 32
    assert small.levels[0].bandwidth_GBps == base.levels[0].bandwidth_GBps
    assert small.levels[1] == base.levels[1]
    assert base.counts == (4, 16)  # the original is unchanged
    assert base.scaled(parse_scale("node=8,gpu=2")).counts == (8, 2)


def test_parse_scale():
    assert parse_scale("node=2") == {"node": 2}
    assert parse_scale(" node = 2 , gpu=4 ") == {"node": 2, "gpu": 4}
    assert parse_scale("") == {}


@pytest.mark.parametrize("spec", ["node", "node=", "node=x", "node=2.5", "node:2"])
def test_bad_scale_spec(spec):
    with pytest.raises(SynthError, match=r"expected LEVEL=COUNT, e\.g\. --scale node=2") as info:
        parse_scale(spec)
    assert spec in str(info.value)


@pytest.mark.parametrize("count", [0, -1])
def test_scale_count_below_one(count):
    with pytest.raises(SynthError, match=rf"--scale node={count}: a level count must be >= 1"):
        load_topology("p2-a100").scaled(parse_scale(f"node={count}"))


def test_scale_unknown_level_names_the_levels():
    with pytest.raises(SynthError, match=r"unknown level 'rack'; topology 'p2-a100' has levels node, gpu"):
        load_topology("p2-a100").scaled({"rack": 2})


# ---------------------------------------------------------------- validation errors

GOOD_LEVEL = "  - name: node\n    count: 4\n    bandwidth_GBps: 8.0\n    latency_us: 5.0\n"


def _load(tmp_path, text: str, name: str = "bad.yaml") -> str:
    """Load ``text`` as a topology file; return the SynthError message."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SynthError) as info:
        load_topology(str(path))
    msg = str(info.value)
    assert "\n" not in msg  # one line
    assert msg.startswith(f"{path}: "), msg  # names the file
    return msg


def test_good_level_snippet_is_valid(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text("name: t\nlevels:\n" + GOOD_LEVEL)
    assert load_topology(str(path)).counts == (4,)


def test_malformed_yaml_reports_line_and_column(tmp_path):
    msg = _load(tmp_path, "name: t\nlevels:\n  - name: node\n    count: 4: 5\n")
    assert "malformed YAML at line 4, column 13" in msg
    assert "mapping values are not allowed here" in msg


def test_malformed_yaml_tab_indent(tmp_path):
    msg = _load(tmp_path, "name: t\n\tlevels: 3\n")
    assert "malformed YAML at line 2, column 1" in msg


def test_unknown_top_level_key(tmp_path):
    msg = _load(tmp_path, "name: t\nlevls:\n" + GOOD_LEVEL)
    assert "unknown key 'levls' at top level" in msg
    assert "allowed keys are name, description, levels" in msg


def test_unknown_key_in_a_level(tmp_path):
    msg = _load(tmp_path, "name: t\nlevels:\n" + GOOD_LEVEL + "    colour: red\n")
    assert "levels[0] (node): unknown key 'colour'" in msg
    assert "allowed keys are name, count, bandwidth_GBps, latency_us, ports, fabric, link, nvlinks, nvls, " \
           "compute_capability" in msg


@pytest.mark.parametrize(
    "field, fix",
    [
        ("name", "name: node"),
        ("count", "count: 4"),
        ("bandwidth_GBps", "bandwidth_GBps: 25.0"),
        ("latency_us", "latency_us: 5.0"),
    ],
)
def test_missing_required_field(tmp_path, field, fix):
    lines = [ln for ln in GOOD_LEVEL.splitlines() if field not in ln]
    level = "\n".join(lines).replace("    ", "  - ", 1) if field == "name" else "\n".join(lines)
    msg = _load(tmp_path, "name: t\nlevels:\n" + level + "\n")
    assert f"missing field '{field}'; add e.g. '{fix}'" in msg
    assert "levels[0]" in msg


def test_missing_field_in_second_level_names_its_index(tmp_path):
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL + "  - name: gpu\n    count: 2\n    latency_us: 1\n")
    assert "levels[1] (gpu): missing field 'bandwidth_GBps'; add e.g. 'bandwidth_GBps: 25.0'" in msg


@pytest.mark.parametrize("count", [0, -3])
def test_count_below_one(tmp_path, count):
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL.replace("count: 4", f"count: {count}"))
    assert f"levels[0] (node): 'count' must be >= 1, got {count}" in msg


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("count", '"four"', "field 'count' must be an integer, got 'four'; write e.g. 'count: 4'"),
        ("count", "2.5", "field 'count' must be an integer, got 2.5; write e.g. 'count: 4'"),
        ("count", "true", "field 'count' must be an integer, got True; write e.g. 'count: 4'"),
        (
            "bandwidth_GBps",
            "fast",
            "field 'bandwidth_GBps' must be a number, got 'fast'; write e.g. 'bandwidth_GBps: 25.0'",
        ),
        ("latency_us", "[1]", "field 'latency_us' must be a number, got [1]; write e.g. 'latency_us: 5.0'"),
    ],
)
def test_wrong_type(tmp_path, field, value, expected):
    text = re.sub(rf"{field}: .*", f"{field}: {value}", GOOD_LEVEL)
    msg = _load(tmp_path, "levels:\n" + text)
    assert "levels[0] (node)" in msg
    assert expected in msg


def test_name_of_wrong_type(tmp_path):
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL.replace("name: node", "name: 5"))
    assert "levels[0]: field 'name' must be a string, got 5; write e.g. 'name: node'" in msg


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("bandwidth_GBps", "0", "'bandwidth_GBps' must be > 0, got 0.0"),
        ("latency_us", "-1", "'latency_us' must be >= 0, got -1.0"),
    ],
)
def test_out_of_range_numbers(tmp_path, field, value, expected):
    text = re.sub(rf"{field}: .*", f"{field}: {value}", GOOD_LEVEL)
    assert expected in _load(tmp_path, "levels:\n" + text)


def test_ports_and_fabric_validated(tmp_path):
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL + "    ports: 0\n")
    assert "'ports' must be >= 1, got 0" in msg
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL + "    fabric: mesh\n")
    assert "'fabric' must be one of switch, ring, got 'mesh'" in msg


GPU_LEVEL = "  - name: gpu\n    count: 8\n    bandwidth_GBps: 450\n    latency_us: 1\n"


@pytest.mark.parametrize(
    "outer, inner, expected",
    [
        ("    link: wire\n", "", "levels[0] (node): 'link' must be one of net, nvlink, pcie, got 'wire'"),
        ("", "    link: pcie\n    nvlinks: 18\n", "levels[1] (gpu): 'nvlinks' must be >= 1 and only on a level with link: nvlink"),
        ("", "    nvlinks: 0\n", "levels[1] (gpu): 'nvlinks' must be >= 1"),
        ("", "    nvls: yes please\n", "levels[1] (gpu): field 'nvls' must be true or false, got 'yes please'"),
        ("", "    nvls: true\n    fabric: ring\n", "levels[1] (gpu): 'nvls: true' needs link: nvlink and fabric: switch"),
        ("", "    link: pcie\n    nvls: true\n", "levels[1] (gpu): 'nvls: true' needs link: nvlink and fabric: switch"),
        ("    compute_capability: 9.0\n", "", "levels[0] (node): 'compute_capability' describes the devices: "
                                            "give it on the innermost level"),
        ("", "    compute_capability: 0\n", "levels[1] (gpu): 'compute_capability' must be a CUDA compute capability"),
        ("", "    compute_capability: H100\n", "levels[1] (gpu): field 'compute_capability' must be a number"),
    ],
)
def test_nccl_keys_validated(tmp_path, outer, inner, expected):
    assert expected in _load(tmp_path, "levels:\n" + GOOD_LEVEL + outer + GPU_LEVEL + inner)


def test_nccl_keys_load_and_round_trip(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("levels:\n" + GOOD_LEVEL + "    ports: 8\n" + GPU_LEVEL
                    + "    nvlinks: 18\n    nvls: true\n    compute_capability: 9\n")
    topo = load_topology(str(path))
    gpu = topo.levels[1]
    assert (gpu.link, gpu.nvlinks, gpu.nvls, gpu.compute_capability) == (None, 18, True, 9.0)
    assert topo.link(1) == "nvlink" and topo.link(0) == "net"  # the defaults by position
    assert topology_from_dict(topo.to_dict(), "x") == topo
    assert "link" not in topo.to_dict()["levels"][0]  # only the keys the file gave


def test_duplicate_level_name(tmp_path):
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL + GOOD_LEVEL)
    assert "duplicate level name 'node'; level names must be unique" in msg


@pytest.mark.parametrize("name", RESERVED_NAMES)
def test_reserved_level_name(tmp_path, name):
    assert set(RESERVED_NAMES) >= {"root", "inside", "parallel", "master"}
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL.replace("name: node", f"name: {name}"))
    assert f"level name '{name}' must be an identifier other than root, inside, parallel, master" in msg


def test_non_identifier_level_name(tmp_path):
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL.replace("name: node", "name: 2node"))
    assert "level name '2node' must be an identifier" in msg


@pytest.mark.parametrize(
    "text",
    ["", "- a\n- b\n", "name: t\n", "levels: []\n", "levels: 3\n"],
    ids=["empty", "list", "no-levels", "empty-levels", "levels-not-list"],
)
def test_bad_document_shape(tmp_path, text):
    msg = _load(tmp_path, text)
    assert "expected a mapping with keys name, description, levels" in msg or (
        "'levels' must be a non-empty list of levels, outermost first" in msg
    )


def test_level_that_is_not_a_mapping(tmp_path):
    msg = _load(tmp_path, "levels:\n  - node\n")
    assert "levels[0]: expected a mapping with keys name, count" in msg


def test_top_level_name_and_description_must_be_strings(tmp_path):
    assert "'name' must be a string" in _load(tmp_path, "name: [1]\nlevels:\n" + GOOD_LEVEL)
    assert "'description' must be a string" in _load(tmp_path, "description: 7\nlevels:\n" + GOOD_LEVEL)


def test_topology_from_dict_names_its_source():
    with pytest.raises(SynthError, match=r"^plan\.json: topology: levels\[0\] \(node\): 'count' must be >= 1"):
        topology_from_dict(
            {"levels": [{"name": "node", "count": 0, "bandwidth_GBps": 1, "latency_us": 1}]},
            "plan.json: topology",
        )


# ---------------------------------------------------------------- fixed bugs (regressions)


def test_non_utf8_file_is_a_clean_error(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe name: x\n")
    with pytest.raises(SynthError, match=re.escape(str(path))):
        load_topology(str(path))


def test_nan_bandwidth_rejected(tmp_path):
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL.replace("bandwidth_GBps: 8.0", "bandwidth_GBps: .nan"))
    assert "bandwidth_GBps" in msg


def test_duplicate_key_in_a_level_rejected(tmp_path):
    msg = _load(tmp_path, "levels:\n" + GOOD_LEVEL + "    count: 3\n")
    assert "count" in msg


# ---------------------------------------------------------------- device (job planner)

GPU_TOPOLOGIES = ("dgx-a100", "dgx-h100", "p2-a100", "p2-v100", "p5", "a3-mega", "a3-high", "p4de", "oci-bm-gpu4-8", "abci-v",
                  "abci-a", "p4d", "hgx-h200", "gke-a3ultra-1gpu1nic", "dgx-h800",
                  "gcp-a3-ultra", "gcp-a3-high-tcp1")


def _gpus() -> dict:
    import yaml

    return yaml.safe_load((REPO / "data" / "gpus.yaml").read_text())


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_devices_come_from_the_gpu_table(name):
    """Every GPU topology's device is an entry of data/gpus.yaml (its own GPU, or
    the smallest-memory candidate where the memory size is not confirmed); the
    others have none: illustrative or CPU testbeds, and GPUs whose usable memory
    the table does not state (B200, GB200)."""
    data = _gpus()
    entry = data["topologies"][name]
    device = load_topology(name).device
    if name not in GPU_TOPOLOGIES:
        assert device is None and "candidates" not in entry
        assert entry["gpu"] is None or "memory_GiB" not in data["gpus"][entry["gpu"]]
        return
    key = entry["gpu"] or min(entry["candidates"], key=lambda c: data["gpus"][c]["memory_GB"])
    gpu = data["gpus"][key]
    assert device.memory_GiB == gpu["memory_GiB"]  # nvidia-smi's total, not the marketing 'GB'
    assert device.peak_TFLOPs == gpu["peak_TFLOPs"]  # dense, not the sparsity figure
    assert device.memory_bandwidth_GBps == gpu["memory_bandwidth_GBps"]  # the datasheet's HBM bandwidth
    assert device.name == gpu["name"].split(" (")[0]
    assert key in device.source and device.source.startswith("data/gpus.yaml")


def test_device_round_trips_and_is_optional(tmp_path):
    topo = load_topology("dgx-a100")
    assert topology_from_dict(topo.to_dict(), "x") == topo
    assert "device" not in load_topology("testbed-2x4").to_dict()
    path = tmp_path / "t.yaml"
    path.write_text("levels:\n" + GOOD_LEVEL + "device: {name: X, memory_GiB: 16, peak_TFLOPs: 100}\n")
    device = load_topology(str(path)).device
    assert (device.memory_GiB, device.peak_TFLOPs, device.source) == (16.0, 100.0, "")
    assert device.memory_bytes == 16 * 2**30 and device.peak_flops == 100e12
    assert device.memory_bandwidth_GBps is None and device.memory_bandwidth_Bps is None  # optional
    assert load_topology("dgx-a100").device.memory_bandwidth_Bps == 2039e9


@pytest.mark.parametrize("device, expected", [
    ("[1]", "device: expected a mapping with keys name, memory_GiB, peak_TFLOPs, memory_bandwidth_GBps, source"),
    ("{name: X, memory_GiB: 16}", "device: missing field 'peak_TFLOPs'; add e.g. 'peak_TFLOPs: 312'"),
    ("{name: X, memory_GiB: 16, peak_TFLOPs: 1, hbm: 3}", "device: unknown key 'hbm'; allowed keys are name, "
                                                          "memory_GiB, peak_TFLOPs, memory_bandwidth_GBps, source"),
    ("{name: X, memory_GiB: 8, peak_TFLOPs: 1, memory_bandwidth_GBps: 0}",
     "device: 'memory_bandwidth_GBps' must be a positive number, got 0.0"),
    ("{name: X, memory_GiB: lots, peak_TFLOPs: 1}", "device: field 'memory_GiB' must be a number, got 'lots'"),
    ("{name: X, memory_GiB: 0, peak_TFLOPs: 1}", "device: 'memory_GiB' must be a positive number, got 0.0"),
    ("{name: X, memory_GiB: 8, peak_TFLOPs: .inf}", "device: 'peak_TFLOPs' must be a positive number, got inf"),
])
def test_bad_device(tmp_path, device, expected):
    assert expected in _load(tmp_path, "levels:\n" + GOOD_LEVEL + f"device: {device}\n")


def test_parse_device():
    from synth.topology import parse_device

    device = parse_device("memory_GiB=24,peak_TFLOPs=82.6,name=L4")
    assert (device.name, device.memory_GiB, device.peak_TFLOPs) == ("L4", 24.0, 82.6)
    with pytest.raises(SynthError, match=r"^--device memory_GiB=x: must be a number$"):
        parse_device("memory_GiB=x,peak_TFLOPs=1")
    with pytest.raises(SynthError, match=r"^--device: missing field 'peak_TFLOPs'"):
        parse_device("memory_GiB=1")
    with pytest.raises(SynthError, match=r"^--device: unknown key 'hbm'"):
        parse_device("memory_GiB=1,peak_TFLOPs=1,hbm=2")


TRANSPORT = {"a3-high": "tcpx", "a3-mega": "tcpxo", "abci-a": "ib", "abci-v": "ib", "dgx-a100": "ib", "dgx-h100": "ib",
             "dgx-h800": "ib", "gcp-a4": "roce", "gke-a3ultra-1gpu1nic": "roce", "oci-bm-gpu4-8": "roce",
             "gcp-a3-ultra": "roce", "gcp-a3-high-tcp1": "tcp", "together-b200-ib": "ib",
             "p3dn": "efa", "p4d": "efa", "p4de": "efa", "p5": "efa2", "p6-b200": "efa4"}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_networks_transport_is_stated_where_its_sources_state_it(name):
    topo = load_topology(name)
    stated = [lv.transport for lv in topo.levels if lv.transport is not None]
    assert stated == ([TRANSPORT[name]] if name in TRANSPORT else [])
    assert all(topo.link(i) == "net" for i, lv in enumerate(topo.levels) if lv.transport)


def test_transport_is_one_of_four_and_only_on_a_network():
    def level(**extra):
        return {"name": "node", "count": 2, "bandwidth_GBps": 25.0, "latency_us": 5.0, **extra}

    gpu = {"name": "gpu", "count": 8, "bandwidth_GBps": 300.0, "latency_us": 1.0}
    ok = topology_from_dict({"name": "t", "levels": [level(transport="roce"), gpu]}, "t.yaml")
    assert ok.levels[0].transport == "roce" and topology_from_dict(ok.to_dict(), "x") == ok
    with pytest.raises(SynthError, match=r"'transport' must be one of ib, roce, efa, efa2, efa4, tcp, tcpx, tcpxo, on a level with link: net; "
                                         r"got 'ethernet' on link: net"):
        topology_from_dict({"name": "t", "levels": [level(transport="ethernet"), gpu]}, "t.yaml")
    with pytest.raises(SynthError, match="got 'ib' on link: nvlink"):
        topology_from_dict({"name": "t", "levels": [level(), {**gpu, "transport": "ib"}]}, "t.yaml")


# shipped topologies that leave part of the GPU-to-network path to the documented defaults, and why
PATH_DEFAULTED = {
    "p2-a100": "P2 states no transport", "p2-v100": "P2 states no transport",
    "rack": "an illustrative hierarchy, no measured system",
    "testbed-2x2x2": "the CPU testbed (MPI model)", "testbed-2x4": "the CPU testbed (MPI model)",
    "testbed-4x4": "the CPU testbed (MPI model)",
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_network_states_its_gpus_path_to_it(name):
    topo = load_topology(name)
    nets = [lv for i, lv in enumerate(topo.levels) if topo.link(i) == "net"]
    if name in PATH_DEFAULTED:
        assert topo.notes and all("the defaults of docs/model.md" in n for n in topo.notes)
        return
    assert topo.notes == ()
    for lv in nets[-1:]:  # the node level: the path from a GPU to its NICs
        assert lv.gpus_per_nic and lv.pcie_gen and lv.pcie_width and lv.transport
        text = (topologies_dir() / f"{name}.yaml").read_text()
        assert "GPU-to-network path" in text  # its source, in a comment


def test_an_older_file_gets_the_documented_defaults_and_a_note():
    old = topology_from_dict({"name": "old", "levels": [
        {"name": "node", "count": 2, "bandwidth_GBps": 25.0, "latency_us": 5.0, "ports": 4},
        {"name": "gpu", "count": 8, "bandwidth_GBps": 300.0, "latency_us": 1.0}]}, "old.yaml")
    path = old.network_path(0)
    # ib, the NICs spread evenly (8 GPUs // 4 NICs = 2 per NIC), Gen 5 x16 = 16 x 32 GT/s x 128/130 / 8
    assert (path.transport, path.gpus_per_nic, path.nics_per_group) == ("ib", 2, 1.0)
    assert path.pcie_GBps == pytest.approx(16 * 32 * 128 / 130 / 8)
    assert old.network_path(1) is None
    assert old.notes == ("level node states no transport, gpus_per_nic, pcie_gen, pcie_width: priced with transport "
                         "ib, gpus_per_nic 2, pcie_gen 5, pcie_width 16 (the defaults of docs/model.md)",)
    doc = old.to_dict()
    assert doc["notes"] == list(old.notes)
    assert topology_from_dict(doc, "again") == old  # the note is derived: a loader reads past it
    stated = topology_from_dict({**doc, "levels": [{**doc["levels"][0], "transport": "efa", "gpus_per_nic": 1,
                                                     "pcie_gen": 4, "pcie_width": 8}, doc["levels"][1]]}, "new")
    assert stated.notes == () and "notes" not in stated.to_dict()
    assert stated.network_path(0).pcie_GBps == pytest.approx(8 * 16 * 128 / 130 / 8)


def test_the_note_is_in_the_main_commands_json(cli):
    code, out, err = cli("--topology", "p2-a100", "--axes", "dp=4,mp=16", "--reduce", "dp", "--no-verify", "--top", "0",
                         "--json")
    assert code == 0, err
    import json

    assert json.loads(out)["topology"]["notes"] == list(load_topology("p2-a100").notes)
    assert len(load_topology("p2-a100").notes) == 1 and "transport ib" in load_topology("p2-a100").notes[0]
