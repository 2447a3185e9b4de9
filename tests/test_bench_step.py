"""bench/bench_step.py's routing trace: the hit rate it sets is exact, and the pools replaying
it make the same choices as the host twin that drew it (the device run asserts the same)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from ftw.formats import LayerFormat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("bench_step", os.path.join(ROOT, "bench", "bench_step.py"))
bench_step = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_step)
K = bench_step.K


@pytest.mark.parametrize("miss_rate", [0.5, 0.1, 0.01, 0.37, 0.0, 1.0])
def test_miss_counts_are_spread_and_exact_at_every_prefix(miss_rate):
    n = 200
    counts = bench_step.miss_counts(n, miss_rate)
    assert len(counts) == n and all(0 <= c <= K for c in counts)
    prefix = np.cumsum(counts)
    for i in range(1, n + 1):
        assert abs(prefix[i - 1] - i * K * miss_rate) <= 0.5 + 1e-9


@pytest.mark.parametrize("hit", [0.5, 0.9, 0.99])
def test_trace_sets_the_hit_rate_exactly_and_replays_identically(hit):
    E, L, S, steps = 40, 4, 16, 25
    fmt = LayerFormat.of("nvfp4")
    trace, twin_stats, final = bench_step.make_trace(E, L, S, hit, steps, fmt, seed=3)
    assert len(trace) == bench_step.WARM_STEPS + steps
    picks = steps * L * K
    assert twin_stats["misses"] == round((1 - hit) * picks)
    assert twin_stats["hits"] + twin_stats["misses"] == picks
    for step in trace:
        for h, m in step:  # one token's experts: distinct, K of them
            ids = np.concatenate([h, m])
            assert len(ids) == K and len(set(ids.tolist())) == K

    # a fresh pool of real rows, fed the trace, hits exactly where the trace says and ends
    # with the twin's resident sets
    rng = np.random.default_rng(0)
    rows = {"gate_up": 48, "down": 32, "gate_up_scale": 16, "down_scale": 16}
    banks = bench_step.ExpertBanks({b: {l: rng.integers(0, 256, (E, n), dtype=np.uint8) for l in range(L)}
                                    for b, n in rows.items()}, {l: fmt for l in range(L)}, E)
    pools = bench_step.fresh_pools(bench_step.Dry(), banks, L, S)
    for t, step in enumerate(trace):
        if t == bench_step.WARM_STEPS:
            pools.reset_stats()
        pools._p.begin_step()  # noqa: SLF001
        for l, (h, m) in enumerate(step):
            assert all(pools.slot_of(l, int(e)) >= 0 for e in h)
            assert all(pools.slot_of(l, int(e)) < 0 for e in m)
            pools.request(l, np.concatenate([h, m]))
    assert bench_step.same_choices(next(iter(pools.stats().values())), twin_stats)
    for l in range(L):
        assert [e for e in range(E) if pools.slot_of(l, e) >= 0] == final[l].tolist()
        for e in final[l][:3]:  # and the slots hold the expert's bytes
            s = pools.slot_of(l, int(e))
            assert pools.read_slot(0, "gate_up", s) == banks.banks["gate_up"][l][e].tobytes()


def test_dry_run_measures_every_mode_at_every_rate(tmp_path, capsys):
    rows: list = []
    bench_step.bench_case(bench_step.Dry(), "deepseek-v3:nvfp4", [0.5, 0.99], 3, 24, 10, 6, 1.0, 0, rows)
    assert [r["hit_target"] for r in rows] == [0.5, 0.99]
    for r in rows:
        assert r["hit_rate"] == pytest.approx(1 - round((1 - r["hit_target"]) * 6 * 3 * K) / (6 * 3 * K))
        assert r["copy_bytes_per_step"] > 0
        for mode in bench_step.MODES:
            assert r[mode]["step_ms"] > 0 and r[mode]["compute_ms"] > 0
    assert "overlap" in capsys.readouterr().out
