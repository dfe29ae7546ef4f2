"""Wang et al. 2024's load-balance measurements (data/moe_load_balance.jsonl),
the transcription checked against itself: recorded, not priced
(docs/planner.md, "DeepSeek-V3 on 2,048 H800s")."""

from __future__ import annotations

import json
from pathlib import Path

ROWS = [json.loads(line) for line in
        (Path(__file__).resolve().parents[2] / "data" / "moe_load_balance.jsonl").read_text().splitlines() if line]


def test_table_2_has_both_methods_at_both_sizes_and_loss_free_balances_better():
    table2 = {(r["model"], r["balancing"]): r for r in ROWS if r["table"] == "2"}
    assert set(table2) == {(m, b) for m in ("1B", "3B") for b in ("Loss-Controlled", "Loss-Free")}
    for size in ("1B", "3B"):
        free, controlled = table2[size, "Loss-Free"], table2[size, "Loss-Controlled"]
        assert free["maxvio_global"] < controlled["maxvio_global"]
        assert free["validation_perplexity"] < controlled["validation_perplexity"]


def test_table_3_repeats_table_2s_one_billion_loss_free_row_to_three_digits():
    first = next(r for r in ROWS if r["table"] == "3")
    same = next(r for r in ROWS if r["table"] == "2" and r["model"] == "1B" and r["balancing"] == "Loss-Free")
    assert round(first["maxvio_global"], 2) == same["maxvio_global"]
    assert first["validation_perplexity"] == same["validation_perplexity"]


def test_the_models_route_6_of_64_experts_beside_2_shared():
    for r in ROWS:
        assert (r["activated_routed_experts"], r["routed_experts"], r["shared_experts"]) == (6, 64, 2)
        assert "arXiv:2408.15664" in r["source"] and "Eq. 4" in r["source"]
