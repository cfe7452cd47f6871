"""The writers' per-byte costs on this host: the pool of freed page-cache pages is spent by the stopping rules, and
the probe leaves nothing behind."""

from __future__ import annotations

from pathlib import Path


def test_the_cost_probe_spends_freed_page_cache_until_it_turns_cold_and_leaves_nothing(tmp_path: Path) -> None:
    """Spending the pool of freed page-cache pages stops after two chunks that write slower than the cold bar (a
    bar no write meets: two chunks), at the cap (a bar every write meets), or at a full disk; the whole probe
    removes what it wrote. Which chunks a VM hands out warm is the host's: only the stopping rules are asserted."""
    from ckptio.plan.measure.writer_costs import _take_freed_page_cache, measure_writer_costs

    names = iter(range(100))

    def new_file() -> str:
        return str(tmp_path / f"chunk-{next(names)}")

    chunk = 1 << 20
    assert _take_freed_page_cache(new_file, cold_below=float("inf"), chunk=chunk, cap=16 * chunk) == 2 * chunk
    assert _take_freed_page_cache(new_file, cold_below=0.0, chunk=chunk, cap=5 * chunk) == 5 * chunk
    assert len(list(tmp_path.iterdir())) == 7

    def unwritable() -> str:
        return str(tmp_path / "missing-dir" / "chunk")

    assert _take_freed_page_cache(unwritable, cold_below=0.0, chunk=chunk, cap=4 * chunk) == 0
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    costs = measure_writer_costs(1 << 20, directory=str(probe_dir))
    assert all(rate > 0 for rate in costs.to_json().values()) and list(probe_dir.iterdir()) == []
