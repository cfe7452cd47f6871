"""The resume's report: the restore against plain dcp.load in the verdict line, and what it stands on."""

from __future__ import annotations

from ckptio.demo.job import RankResult
from ckptio.demo.resume import ResumeCheck


def _rank(rank: int, *, restore_s: float, dcp_load_s: float | None, page_cache: str | None) -> RankResult:
    return RankResult(mode="resume", rank=rank, losses={10: 1.5}, restored_step=9, restore_s=restore_s,
                      dcp_load_s=dcp_load_s, page_cache=page_cache if rank == 0 else None)


def test_the_slowest_rank_sets_both_times_and_the_verdict_says_restore_x_s_eq_y_times_dcp_load() -> None:
    uninterrupted = RankResult(mode="ckptio", rank=0, losses={9: 1.6, 10: 1.5})
    ranks = [_rank(0, restore_s=0.2, dcp_load_s=0.9, page_cache="drop_caches"),
             _rank(1, restore_s=0.3, dcp_load_s=1.2, page_cache=None)]
    check = ResumeCheck.of(ranks, uninterrupted)
    assert check.bit_exact and check.cold
    assert (check.restore_s, check.dcp_load_s) == (0.3, 1.2)
    assert check.restore_words() == "restore 0.30 s = 0.25x dcp.load"
    assert "each from a cold page cache (drop_caches)" in check.lines()[-1]


def test_a_warm_cache_s3_or_a_missing_copy_is_said_in_the_verdict() -> None:
    uninterrupted = RankResult(mode="ckptio", rank=0, losses={10: 1.5})
    warm = ResumeCheck.of([_rank(0, restore_s=0.2, dcp_load_s=0.4, page_cache="none")], uninterrupted, s3=True)
    assert warm.restore_words() == "restore 0.20 s = 0.50x dcp.load (from S3, warm page cache)"
    assert "could not be emptied" in warm.lines()[-1] and "the S3 server" in warm.lines()[-1]
    # One rank without DCP's copy leaves nothing to compare (dcp.load ran on every rank or on none).
    missing = ResumeCheck.of([_rank(0, restore_s=0.2, dcp_load_s=None, page_cache="fadvise")], uninterrupted)
    assert missing.restore_words() == "restore 0.20 s (no dcp.save copy of that step to compare)"
    assert "posix_fadvise" in missing.lines()[-1]
