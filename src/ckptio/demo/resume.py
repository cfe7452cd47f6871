"""The demo's resume, as the runner reports it: the restored run's losses against the uninterrupted run's, and
ckptio's restore time against plain ``dcp.load`` of DCP's copy of the same step, each from a cold page cache.

The ranks measure (:func:`ckptio.demo.rank.resume`); this module only gathers their results and words them. It must
never run anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptio.demo.job import RankResult

COLD = {"drop_caches": "a cold page cache (drop_caches)",
        "fadvise": "a cold page cache (posix_fadvise DONTNEED on every file: no root to drop_caches)"}
"""How each timed read started, by how the cache was emptied (:func:`ckptio.plan.measure.disk.drop_page_cache`)."""


@dataclass(kw_only=True, slots=True)
class ResumeCheck:
    """The resumed run against the uninterrupted one, and its restore against plain ``dcp.load``."""

    restored_step: int | None
    """Newest ckptio step restored."""

    resumed: dict[int, float]
    """Losses of the resumed run, per step."""

    uninterrupted: dict[int, float]
    """Losses of the uninterrupted ckptio run at the same steps."""

    restore_s: float | None = None
    """ckptio's restore, the slowest rank (the job resumes when it is done)."""

    dcp_load_s: float | None = None
    """Plain ``dcp.load`` of the ``dcp.save`` run's copy of the same step, the slowest rank; None without one."""

    page_cache: str | None = None
    """How the page cache was emptied before each timed read (:data:`COLD`'s keys), or ``none``."""

    s3: bool = False
    """ckptio restored from the demo's S3 server (DCP's copy is on the directory store either way)."""

    @classmethod
    def of(cls, resumed: list[RankResult], uninterrupted: RankResult, *, s3: bool = False) -> ResumeCheck:
        first = resumed[0]
        times = [r.restore_s for r in resumed if r.restore_s is not None]
        loads = [r.dcp_load_s for r in resumed if r.dcp_load_s is not None]
        return cls(restored_step=first.restored_step, resumed=first.losses,
                   uninterrupted={s: uninterrupted.losses[s] for s in first.losses},
                   restore_s=max(times) if times else None,
                   dcp_load_s=max(loads) if len(loads) == len(resumed) else None,
                   page_cache=first.page_cache, s3=s3)

    @property
    def bit_exact(self) -> bool:
        return bool(self.resumed) and all(self.uninterrupted.get(s) == v for s, v in self.resumed.items())

    @property
    def cold(self) -> bool:
        return self.page_cache in COLD

    def restore_words(self) -> str:
        """The verdict line's part: ``restore X s = Yx dcp.load``, and what it stands on when that is not plain."""
        if self.restore_s is None:
            return "no restore"
        words = f"restore {self.restore_s:.2f} s"
        if self.dcp_load_s is None:
            return words + " (no dcp.save copy of that step to compare)"
        words += f" = {self.restore_s / self.dcp_load_s:.2f}x dcp.load"
        notes = (["from S3"] if self.s3 else []) + ([] if self.cold else ["warm page cache"])
        return words + (f" ({', '.join(notes)})" if notes else "")

    def lines(self) -> list[str]:
        """What the resume showed, for the console."""
        if self.restored_step is None:
            return ["[red]✗ resume: no committed ckptio step was found[/]"]
        first = min(self.resumed)
        resumed, uninterrupted = self.resumed[first], self.uninterrupted[first]
        mark = "[green]✓ bit-exact[/]" if self.bit_exact else "[red]✗ DIFFERENT[/]"
        lines = [f"Resume: a fresh process group restored step {self.restored_step}; loss at step {first}: "
                 f"resumed {resumed!r} ({resumed.hex()}) vs uninterrupted {uninterrupted!r} ({uninterrupted.hex()}) "
                 f"{mark}; {len(self.resumed)} steps compared."]
        if self.restore_s is None:
            return lines
        start = COLD.get(self.page_cache or "", "a warm page cache: it could not be emptied here (no drop_caches, "
                         "no posix_fadvise), so both reads may come from memory")
        source = "the S3 server" if self.s3 else "the directory store"
        if self.dcp_load_s is None:
            lines.append(f"Restore: ckptio {self.restore_s:.2f} s from {source} (slowest rank), from {start}; no "
                         "dcp.save copy of that step to compare with.")
        else:
            lines.append(f"Restore: ckptio {self.restore_s:.2f} s from {source}, plain dcp.load of dcp.save's copy "
                         f"of step {self.restored_step} {self.dcp_load_s:.2f} s from the directory store "
                         f"({self.restore_s / self.dcp_load_s:.2f}x; slowest rank each), each from {start}.")
        return lines
