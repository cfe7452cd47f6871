"""No bad input makes ``ckptio`` print a traceback: every subcommand, fed hostile arguments and files as a real
subprocess, exits 0, 1 or 2 with a short message — never a Python traceback, never a hang.

The battery is built per class of problem (missing files, directories for files, binary/empty/garbage/huge JSON,
non-finite, negative, zero and enormous numbers for every numeric flag, unknown units and presets, URLs no backend
serves), not per reported repro. The subprocesses run in a small thread pool once per module; each case is then
its own test. ``probe`` and ``admit --probe`` only ever reach a store with a bound of a few seconds and KiB files.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import ckptio

# ~175 interpreters: about 40 s on two idle cores, minutes on a loaded machine.
pytestmark = pytest.mark.slow

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(ckptio.__file__)))
_TIMEOUT_S = 90  # a case that takes longer counts as a hang (the slowest legitimate one takes ~2 s)

# A store and a job every case shares unless it is the thing under test.
_JOB = ["--params", "8B", "--ranks", "64"]
_STORE = ["--write-bandwidth", "10GB/s"]
# A probe that finishes in about a second if it ever starts.
_TINY_PROBE = ["--max-seconds", "2", "--file-size", "64KiB", "--writers", "1", "--files-per-writer", "1",
               "--small-files", "4", "--no-fsync"]

_BAD_NUMBERS = ["nan", "inf", "-inf", "-1", "0", "1e400", "99999999999999999999999999", "abc", "10XB/s", ""]
_HUGE_INT = "9" * 400
"""An integer Python reads, and no float holds."""


def _files(d: Path) -> dict[str, str]:
    """Hostile files, by name."""
    out: dict[str, str] = {}

    def write(name: str, data: bytes) -> None:
        path = d / name
        path.write_bytes(data)
        out[name] = str(path)

    write("binary", bytes(range(256)) * 64)
    write("empty", b"")
    write("garbage", b"this is { not json\n")
    write("array", b"[1, 2, 3]")
    write("nested", b"[" * 100000 + b"]" * 100000)
    good = {"target": "/x", "write_bytes_per_s": 1e9, "per_writer_bytes_per_s": 1e8, "read_bytes_per_s": 1e9,
            "metadata_ops_per_s": 1000.0}
    write("huge_numbers", json.dumps({**good, "write_bytes_per_s": 10**400}).encode())
    write("inf_numbers", json.dumps({**good, "per_writer_bytes_per_s": float("inf")}).encode())
    write("string_numbers", json.dumps({**good, "serialize_bytes_per_s": "fast", "fsync_s": "x"}).encode())
    write("bad_concurrency", json.dumps({**good, "concurrency": [1, "x", None]}).encode())
    write("bad_version", json.dumps({**good, "version": {"x": 1}}).encode())
    write("bool_numbers", json.dumps({**good, "write_bytes_per_s": True}).encode())
    write("tiny_numbers", json.dumps({**good, "write_bytes_per_s": 1e-300, "per_writer_bytes_per_s": 1e-300}).encode())
    write("events_garbage", b"\x00\x01\x02 not events\n")
    write("events_partial", b'{"ts": 1, "mono": 1, "rank": 0, "event": "save_requested"')
    write("events_wrong_types", json.dumps({"ts": "a", "mono": [], "rank": "x", "event": 5}).encode() + b"\n")
    for name, number in (("huge_int", _HUGE_INT), ("nan", "NaN"), ("inf", "Infinity"), ("1e308", "1e308")):
        # JSON the standard library reads: a number of hundreds of digits, NaN, Infinity, the largest doubles.
        write(f"events_{name}", (
            '{"ts": 1, "mono": 1, "rank": 0, "event": "save_requested", "step": 1}\n'
            f'{{"ts": 2, "mono": 2, "rank": 0, "event": "save_returned", "step": 1, "blocking_s": {number}, '
            f'"bytes": {number}}}\n'
            f'{{"ts": 3, "mono": 3, "rank": 0, "event": "step_end", "step": 1, "seconds": {number}}}\n').encode())
    (d / "adir").mkdir()
    out["dir"] = str(d / "adir")
    out["missing"] = str(d / "no-such-file.json")
    (d / "root-with-junk" / "step-00000003").mkdir(parents=True)
    (d / "root-with-junk" / "step-00000003" / "manifest.json").write_bytes(b"\xff\xfe garbage")
    (d / "root-with-junk" / "latest").write_bytes(b"\xff" * 10)
    (d / "root-with-junk" / "step-00000007" / "ranks").mkdir(parents=True)
    (d / "root-with-junk" / "step-00000007" / "ranks" / "0.json").write_text("[]")
    (d / "root-with-junk" / "step-00000007" / "manifest.json").write_text(
        json.dumps({"step": "seven", "world_size": -1, "files": [1, 2], "total_bytes": "x"}))
    out["junk_root"] = str(d / "root-with-junk")
    return out


_URL_LABELS = ("ftp", "remote file", "s3 no bucket", "bad ipv6", "missing", "binary", "junk", "empty")


def _cases(f: dict[str, str]) -> dict[str, list[str]]:
    """Case name (never a path: names are the same in every session) → argv."""
    urls = dict(zip(_URL_LABELS, ("ftp://x/y", "file://remotehost/x", "s3://", "http://[::1", f["missing"],
                                  f["binary"], f["junk_root"], ""), strict=True))
    numbers = {name: argv for name, (argv, _) in _number_cases(f).items()}
    return {**_plan_cases(f), **_simulate_cases(f), **_report_cases(f), **_store_cases(f, urls),
            **_probe_cases(f, urls), **_admit_cases(f, urls), **numbers, **_bounded_time_cases(),
            "demo --help": ["demo", "--help"], "demo --store-bandwidth 10XB/s": ["demo", "--store-bandwidth", "10XB/s"],
            "no command": [], "unknown command": ["frobnicate"]}


def _plan_cases(f: dict[str, str]) -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    # ---- profiles (plan, simulate and admit read them the same way) ----
    for name in ("binary", "empty", "garbage", "array", "nested", "huge_numbers", "inf_numbers", "string_numbers",
                 "bad_concurrency", "bad_version", "bool_numbers", "tiny_numbers", "dir", "missing"):
        cases[f"plan --profile {name}"] = ["plan", *_JOB, "--profile", f[name]]
    cases["simulate --profile binary"] = ["simulate", *_JOB, "--profile", f["binary"], "--checkpoints", "3"]
    cases["admit --profile string_numbers"] = ["admit", *_JOB, "--profile", f["string_numbers"]]

    # ---- every numeric flag of the job and the store, each with two bad numbers (rotating through all) ----
    numeric = ["--params", "--extra-bytes", "--file-size", "--part-size", "--step-time", "--interval", "--mtbf",
               "--save-cost", "--d2h-bandwidth", "--write-bandwidth", "--per-writer-bandwidth", "--read-bandwidth",
               "--metadata-ops", "--put-rate-per-prefix", "--serialize-bandwidth"]
    for i, flag in enumerate(numeric):
        for value in (_BAD_NUMBERS[i % len(_BAD_NUMBERS)], _BAD_NUMBERS[(i + 5) % len(_BAD_NUMBERS)]):
            if flag == "--params":
                argv = ["plan", "--ranks", "64", *_STORE]
            elif flag == "--write-bandwidth":
                argv = ["plan", *_JOB]
            else:
                argv = ["plan", *_JOB, *_STORE]
            cases[f"plan {flag} {value!r}"] = [*argv, f"{flag}={value}"]
    arch = ["--hidden", "4096", "--ffn", "14336", "--heads", "32", "--vocab", "128256", *_STORE]
    for flag in ("--ranks", "--tp", "--pp", "--dp", "--layers", "--prefixes"):
        for value in ("0", "10000000000000000000000"):
            model = ["--layers", "32"] if flag != "--layers" else []
            cases[f"plan {flag} {value}"] = ["plan", *model, *arch, f"{flag}={value}"]
    cases["plan --hidden huge"] = ["plan", "--layers", "32", "--hidden", str(10**30), "--ffn", "1", "--heads", "1",
                                   "--vocab", "1", *_STORE]
    cases["plan --preset unknown"] = ["plan", "--preset", "gpt-17", *_STORE]
    cases["plan nothing"] = ["plan"]
    cases["plan --step-time 1e-300 --interval 500"] = ["plan", *_JOB, *_STORE, "--step-time", "1e-300",
                                                       "--interval", "500"]
    cases["plan --write-bandwidth 1e-300"] = ["plan", *_JOB, "--write-bandwidth", "1e-300"]
    cases["plan --params 1e300"] = ["plan", "--params", "1e300", "--ranks", "8", *_STORE]
    cases["plan --file-size 1MiB --extra-bytes 1PB"] = ["plan", *_JOB, *_STORE, "--file-size", "1MiB",
                                                        "--extra-bytes", "1PB"]
    return cases


def _simulate_cases(f: dict[str, str]) -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    for flag in ("--checkpoints", "--max-pending", "--ranks-per-node"):
        for value in ("100000000", "0"):
            cases[f"simulate {flag} {value}"] = ["simulate", *_JOB, *_STORE, f"{flag}={value}"]
    for flag in ("--loader-read-bandwidth", "--local-bandwidth", "--local-capacity"):
        for value in ("nan", "10XB/s"):
            cases[f"simulate {flag} {value}"] = ["simulate", *_JOB, *_STORE, "--mode", "tiered",
                                                 "--local-bandwidth", "1GB/s", "--local-capacity", "1TB",
                                                 f"{flag}={value}"]
    cases["simulate --ranks 1e7"] = ["simulate", "--params", "8B", "--ranks", "10000000", *_STORE,
                                     "--checkpoints", "3"]
    cases["simulate --interval 1ms --write-bandwidth 1e-300"] = ["simulate", *_JOB, "--write-bandwidth", "1e-300",
                                                                 "--interval", "1ms", "--checkpoints", "50"]
    cases["simulate --events dir"] = ["simulate", *_JOB, *_STORE, "--checkpoints", "2", "--events", f["dir"]]
    cases["simulate --events missing dir"] = ["simulate", *_JOB, *_STORE, "--checkpoints", "2", "--events",
                                              os.path.join(f["missing"], "x", "ev.jsonl")]
    cases["simulate --out .txt"] = ["simulate", *_JOB, *_STORE, "--checkpoints", "2", "--out", f["dir"] + ".txt"]
    return cases


def _report_cases(f: dict[str, str]) -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    for name in ("binary", "empty", "events_partial", "events_wrong_types", "dir", "missing", "nested"):
        cases[f"report {name}"] = ["report", f[name], "--json"]
    cases["report --out dir"] = ["report", f["events_partial"], "--out", f["dir"]]
    return cases


def _store_cases(f: dict[str, str], urls: dict[str, str]) -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    for label, url in urls.items():
        cases[f"ls {label}"] = ["ls", url]
    for label in ("ftp", "remote file", "binary", "junk"):
        cases[f"verify {label}"] = ["verify", urls[label]]
    cases["verify --step -1"] = ["verify", f["junk_root"], "--step", "-1"]
    cases["verify --step 7"] = ["verify", f["junk_root"], "--step", "7"]
    cases["verify --step huge"] = ["verify", f["junk_root"], "--step", str(10**30)]
    return cases


def _probe_cases(f: dict[str, str], urls: dict[str, str]) -> dict[str, list[str]]:
    """Never a real probe beyond a tiny bound."""
    cases: dict[str, list[str]] = {}
    for label in ("ftp", "remote file", "binary", "empty"):
        cases[f"probe {label}"] = ["probe", urls[label], *_TINY_PROBE]
    for flag, value in (("--writers", "100000000"), ("--files-per-writer", "100000000"),
                        ("--small-files", "100000000"), ("--file-size", "1EiB"), ("--max-seconds", "1e400"),
                        ("--max-seconds", "100000000d")):
        tiny = list(_TINY_PROBE)
        k = tiny.index(flag)
        del tiny[k:k + 2]
        cases[f"probe {flag} {value}"] = ["probe", f["dir"], *tiny, f"{flag}={value}"]
    cases["probe --out dir"] = ["probe", f["dir"], *_TINY_PROBE, "--out", f["dir"]]
    return cases


def _admit_cases(f: dict[str, str], urls: dict[str, str]) -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    cases["admit --probe without --root"] = ["admit", *_JOB, "--probe"]
    for label in ("ftp", "remote file", "binary"):
        cases[f"admit --probe --root {label}"] = ["admit", *_JOB, "--probe", "--probe-seconds", "2", "--root",
                                                  urls[label]]
    cases["admit --probe --params 1e300"] = ["admit", "--params", "1e300", "--probe", "--probe-seconds", "2",
                                             "--root", f["dir"]]
    cases["admit --probe-seconds 1e400"] = ["admit", *_JOB, "--probe", "--root", f["dir"], "--probe-seconds=1e400"]
    cases["admit --max-stall nan"] = ["admit", *_JOB, *_STORE, "--max-stall=nan"]
    cases["admit --keep-last -1"] = ["admit", *_JOB, *_STORE, "--keep-last=-1"]
    cases["admit --root ftp"] = ["admit", *_JOB, *_STORE, "--root", "ftp://x/y"]
    cases["admit --data-dir binary"] = ["admit", *_JOB, *_STORE, "--root", f["dir"], "--data-dir", f["binary"]]

    return cases


def _number_cases(f: dict[str, str]) -> dict[str, tuple[list[str], str]]:
    """Numbers no real job has, each a usage error (exit 2) naming its flag: case name → (argv, the flag named).

    Each one failed before the bounds: an internal error (exit 3: an OverflowError, a ValueError, a stalled
    simulator), a plan printed with ``nan`` and exit 0, a value silently ignored, or a message naming no flag."""
    local = ["--local-bandwidth", "5GB/s"]
    tiered = ["--mode", "tiered", "--local-bandwidth", "1GB/s", "--local-capacity", "1TB"]
    plan, sim = ["plan", *_JOB, *_STORE], ["simulate", *_JOB, *_STORE, "--checkpoints", "3"]
    admit = ["admit", *_JOB, *_STORE]
    cases: dict[str, tuple[list[str], str]] = {
        # exit 3 before: OverflowError, ValueError, a stalled simulator
        "plan --durable-every huge int": ([*plan, *local, f"--durable-every={_HUGE_INT}"], "--durable-every"),
        "plan --replicas huge int": ([*plan, *local, f"--replicas={_HUGE_INT}"], "--replicas"),
        "plan --local-every 1e-320": ([*plan, *local, "--local-every=1e-320"], "--local-every"),
        "plan --local-every 1e308": ([*plan, *local, "--local-every=1e308"], "--local-every"),
        "plan --local-every huge steps": ([*plan, *local, "--step-time=1", f"--local-every={_HUGE_INT}"],
                                          "--local-every"),
        "simulate --failures huge int": ([*sim, f"--failures={_HUGE_INT}"], "--failures"),
        "simulate --local-bandwidth 1e-320": ([*sim, *tiered, "--local-bandwidth=1e-320"], "--local-bandwidth"),
        # exit 0 before, with nan or inf in the plan, or the value ignored
        "plan --save-cost 1e308": ([*plan, "--save-cost=1e308"], "--save-cost"),
        "plan --local-bandwidth 1e-320": ([*plan, "--local-bandwidth=1e-320"], "--local-bandwidth"),
        "plan --network-bandwidth 1e-320": ([*plan, *local, "--network-bandwidth=1e-320"], "--network-bandwidth"),
        "plan --write-bandwidth 1e308": (["plan", *_JOB, "--write-bandwidth=1e308"], "--write-bandwidth"),
        "plan --params 1e-320": (["plan", "--ranks", "64", *_STORE, "--params=1e-320"], "--params"),
        "plan --cores-per-rank 1e-320": ([*plan, "--cores-per-rank=1e-320"], "--cores-per-rank"),
        "plan --train-cores 1e308": ([*plan, "--train-cores=1e308"], "--train-cores"),
        "plan --extra-bytes 1e-320": ([*plan, "--extra-bytes=1e-320"], "--extra-bytes"),
        "plan --node-mtbf 1e308": ([*plan, *local, "--node-mtbf=1e308"], "--node-mtbf"),
        "simulate --seed nan": ([*sim, "--seed=nan"], "--seed"),
        "simulate --seed -1": ([*sim, "--seed=-1"], "--seed"),
        "simulate --max-pending huge int": ([*sim, f"--max-pending={_HUGE_INT}"], "--max-pending"),
        "simulate --loader-read-bandwidth 1e308": ([*sim, "--loader-read-bandwidth=1e308"], "--loader-read-bandwidth"),
        "admit --probe-seconds nan": ([*admit, "--probe-seconds=nan"], "--probe-seconds"),
        "admit --keep-last huge int": ([*admit, "--root", f["dir"], f"--keep-last={_HUGE_INT}"], "--keep-last"),
        "admit --max-stall 1e-320": ([*admit, "--max-stall=1e-320"], "--max-stall"),
        "plan --flush-pace 1e-320": ([*plan, "--flush-pace=1e-320"], "--flush-pace"),
        "plan --flush-pace-fraction 1e-320": ([*plan, "--flush-pace-fraction=1e-320"], "--flush-pace-fraction"),
        "admit --store-share 1e-320": ([*admit, "--store-share=1e-320"], "--store-share"),
        "admit --ranks-per-node huge int": ([*admit, f"--ranks-per-node={_HUGE_INT}"], "--ranks-per-node"),
        "simulate --flush-pace nan": ([*sim, "--flush-pace=nan"], "--flush-pace"),
        # exit 2 before, without the flag in the message
        "plan --step-time 1e308": ([*plan, "--step-time=1e308"], "--step-time"),
        "plan --mtbf 1e308": ([*plan, "--mtbf=1e308"], "--mtbf"),
        "plan --node-mtbf 1e-320": ([*plan, *local, "--node-mtbf=1e-320"], "--node-mtbf"),
        "plan --durable-share 1e-320": ([*plan, *local, "--durable-share=1e-320"], "--durable-share"),
        "plan --dp -1": ([*plan, "--dp=-1"], "--dp"),
        "plan --prefixes 0": ([*plan, "--prefixes=0"], "--prefixes"),
        "plan --file-size 1e-320": ([*plan, "--file-size=1e-320"], "--file-size"),
        "simulate --checkpoints -5": (["simulate", *_JOB, *_STORE, "--checkpoints=-5"], "--checkpoints"),
        "simulate --ranks-per-node -1": ([*sim, "--ranks-per-node=-1"], "--ranks-per-node"),
        "admit --keep-last -1": ([*admit, "--keep-last=-1"], "--keep-last"),
        "admit --split-volumes-above -1": ([*admit, "--split-volumes-above=-1"], "--split-volumes-above"),
        "probe --writers -1": (["probe", f["dir"], *_TINY_PROBE[2:], "--writers=-1"], "--writers"),
        "probe --max-seconds 0": (["probe", f["dir"], *_TINY_PROBE[2:], "--max-seconds=0"], "--max-seconds"),
        "probe --file-size 1e308": (["probe", f["dir"], *_TINY_PROBE[:2], *_TINY_PROBE[4:], "--file-size=1e308"],
                                    "--file-size"),
    }
    for name in ("huge_int", "nan", "inf", "1e308"):  # exit 3 before (exit 0 for 1e308)
        cases[f"report events with {name}"] = (["report", f[f"events_{name}"], "--json"], "EVENTS")
    return cases


def _bounded_time_cases() -> dict[str, list[str]]:
    """Failure injection whose time grew without bound: a count of failures no simulation needs (minutes before),
    a schedule of many saves per failure (the pattern jump needs two durable saves), restores that never finish
    (every restore outlasts the time to the next failure: an endless loop before)."""
    return {
        "simulate --failures 99999999999": ["simulate", *_JOB, *_STORE, "--checkpoints", "2",
                                            "--failures", "99999999999"],
        "simulate --failures, many saves per failure": ["simulate", *_JOB, *_STORE, "--checkpoints", "2",
                                                        "--local-bandwidth", "5GB/s", "--local-every", "1ms",
                                                        "--durable-every", "1000000", "--mtbf", "1e10",
                                                        "--failures", "1000"],
        "simulate --failures, restores never finish": ["simulate", *_JOB, *_STORE, "--checkpoints", "2",
                                                       "--local-bandwidth", "5GB/s", "--node-mtbf", "1",
                                                       "--failures", "1000", "--json"],
    }


def _run(argv: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": _SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("AWS_ENDPOINT_URL", None)  # no case may reach the session's S3 server by accident
    try:
        return subprocess.run([sys.executable, "-m", "ckptio._cli.main", *argv], capture_output=True, text=True,
                              check=False, timeout=_TIMEOUT_S, env=env, cwd=cwd, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, -999, "", f"hung for more than {_TIMEOUT_S} s")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.CompletedProcess[str]]]:
    d = tmp_path_factory.mktemp("hostile")
    cases = _cases(_files(d))
    cwd = str(tmp_path_factory.mktemp("cwd"))
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run, argv, cwd) for name, argv in cases.items()}
        yield {name: fut.result() for name, fut in futures.items()}


def _names() -> list[str]:
    # The names only: the files behind them are made once per module by the fixture.
    return list(_cases(collections.defaultdict(str)))


@pytest.mark.parametrize("case", _names())
def test_no_traceback_and_a_documented_exit_code(case: str, results: dict[str, subprocess.CompletedProcess[str]]
                                                 ) -> None:
    proc = results[case]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode in (0, 1, 2), (proc.returncode, proc.stderr[-2000:])
    if proc.returncode != 0:
        assert (proc.stderr + proc.stdout).strip(), "a failure says why"
        assert len(proc.stderr.strip().splitlines()) <= 30, proc.stderr[-2000:]


def test_the_known_repros_are_usage_errors(results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    for case in ("plan --profile binary", "simulate --checkpoints 100000000", "plan --params 1e300"):
        proc = results[case]
        assert proc.returncode == 2, (case, proc.stderr)
        assert proc.stderr.startswith(f"ckptio {case.split()[0]}: "), proc.stderr


def _number_names() -> list[str]:
    return list(_number_cases(collections.defaultdict(str)))


@pytest.mark.parametrize("case", _number_names())
def test_a_number_no_real_job_has_is_a_usage_error_naming_its_flag(
        case: str, results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    proc = results[case]
    _, flag = _number_cases(collections.defaultdict(str))[case]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith(f"ckptio {case.split(maxsplit=1)[0]}: "), proc.stderr
    assert flag in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and len(proc.stderr) < 600, proc.stderr  # no 400 digits
    assert "nan" not in proc.stdout.lower() and "infinity" not in proc.stdout.lower()


def test_failure_injection_is_bounded_in_time_whatever_the_counts(
        results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """A count past the cap is refused at once, naming the flag and the cap; a schedule that would need more saves
    than the simulation's budget stops there and says how many failures fit; restores that never finish end the
    run as not converged. None of them hangs (the fixture counts past _TIMEOUT_S as one)."""
    capped = results["simulate --failures 99999999999"]
    assert capped.returncode == 2 and "--failures" in capped.stderr and "100,000" in capped.stderr, capped.stderr
    budget = results["simulate --failures, many saves per failure"]
    assert budget.returncode == 2, (budget.returncode, budget.stderr[-2000:])
    assert "--failures" in budget.stderr and "saves and failures" in budget.stderr, budget.stderr
    endless = results["simulate --failures, restores never finish"]
    assert endless.returncode == 0, (endless.returncode, endless.stderr[-2000:])
    failures = json.loads(endless.stdout)["failures"]
    assert failures["two_level"]["converged"] is False
