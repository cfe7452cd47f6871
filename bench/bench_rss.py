"""Peak RSS of the training process over 50 saves: flat, and within state × (max_pending + 1) + 10%.

One process saves the same state ``--saves`` times back to back (``overflow="block"``: with ``max_pending`` slots
busy, ``save`` waits), touching one tensor between saves as a training step would. A thread samples this process's
RSS (psutil) every 5 ms. The staging slots live in ``/dev/shm`` and are mapped (pre-faulted) into this process, so
they count in its RSS. The bound is applied to what the state and ckptio add on top of the interpreter + torch +
writer-proxy baseline measured before the state exists: peak − RSS(before the state) ≤ state × (max_pending + 1) × 1.1.
The writer process's RSS is printed for information (it maps the same slots: shared pages, not extra memory).

    .venv/bin/python bench/bench_rss.py [--mib 128] [--saves 50] [--max-pending 1] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
import time

from _common import MiB, RssSampler, make_state, ratio_line, scratch_dir, state_bytes, verdict


class ChildPeak:
    """Peak RSS of this process's children (the writer) sampled in a thread, for information."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            total = 0
            for child in self._me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except Exception:  # a child that just exited
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128, help="state size in MiB (32 MiB tensors + 1,000 tiny)")
    parser.add_argument("--saves", type=int, default=50)
    parser.add_argument("--max-pending", type=int, default=1)
    parser.add_argument("--dir", default="/dev/shm",
                        help="parent of the root (default /dev/shm, fsync off: the trainer's memory does not depend "
                        "on the disk, and 50 saves to a loaded disk take minutes)")
    args = parser.parse_args()

    import ckptio

    with scratch_dir(args.dir, "ckptio-bench-rss-") as root:
        on_disk = not str(root).startswith("/dev/shm")
        ck = ckptio.Checkpointer(str(root / "ckptio"), max_pending=args.max_pending, keep_last=2, fsync=on_disk)
        sampler = RssSampler()
        rss_before_state = sampler.now()
        state = make_state(max(1, args.mib // 32), 32, 1000)
        nbytes = state_bytes(state)
        gc.collect()
        baseline = sampler.now()
        after: dict[int, int] = {}
        children = ChildPeak()
        t0 = time.monotonic()
        with sampler:
            for n in range(1, args.saves + 1):
                state["big.0"].add_(1.0)  # a "training step" mutates the state between saves
                ck.save(n, state)
                after[n] = sampler.now()
                if n % 10 == 0:
                    print(f"  save {n:>3}: RSS {after[n] / MiB:8.1f} MiB (peak so far {sampler.peak / MiB:.1f})",
                          flush=True)
            ck.wait()
        elapsed = time.monotonic() - t0
        writer_peak = children.stop()
        ck.close()

    bound = nbytes * (args.max_pending + 1) * 1.1
    added = sampler.peak - rss_before_state
    s10, s_last = after[min(10, args.saves)], after[args.saves]
    growth = (s_last - s10) / MiB
    print(f"state {nbytes / MiB:.1f} MiB; max_pending {args.max_pending}; {args.saves} saves in {elapsed:.1f} s")
    print(f"RSS before the state {rss_before_state / MiB:.1f} MiB; baseline with the state (before save 1) "
          f"{baseline / MiB:.1f} MiB; peak {sampler.peak / MiB:.1f} MiB")
    print(f"RSS after save {min(10, args.saves)}: {s10 / MiB:.1f} MiB; after save {args.saves}: "
          f"{s_last / MiB:.1f} MiB (growth {growth:+.1f} MiB); writer process peak RSS {writer_peak / MiB:.1f} MiB "
          f"(maps the same shared slots)")
    ratio = added / bound
    print(f"peak − RSS before the state = {added / MiB:.1f} MiB vs bound state × (max_pending+1) + 10% = "
          f"{bound / MiB:.1f} MiB: {ratio:.3f} ({verdict(ratio, 1.0, at_most=True)}); "
          f"raw peak / (state × (max_pending+1)) = {sampler.peak / (nbytes * (args.max_pending + 1)):.3f}")
    ratio_line(peak_added_vs_bound=ratio, rss_growth_10_to_last_mib=f"{growth:+.1f}",
               peak_vs_state=sampler.peak / nbytes, state_mib=f"{nbytes / MiB:.0f}",
               peak_mib=f"{sampler.peak / MiB:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
