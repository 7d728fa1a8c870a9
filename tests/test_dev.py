"""dev.py's test command: how many processes run the whole suite (pytest-xdist)."""

from __future__ import annotations

import os

import pytest

import dev


def test_the_suite_runs_in_the_processes_strata_test_workers_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STRATA_TEST_WORKERS", "3")
    assert dev._test_workers() == ["-n", "3", "--dist", "loadfile"]
    monkeypatch.setenv("STRATA_TEST_WORKERS", "1")
    assert dev._test_workers() == []
    for wrong in ("0", "two", "-1"):
        monkeypatch.setenv("STRATA_TEST_WORKERS", wrong)
        with pytest.raises(SystemExit, match=f"not '{wrong}'"):
            dev._test_workers()


@pytest.mark.parametrize(
    ("cores", "gigabytes", "workers"),
    [(2, 23, 2), (64, 256, 4), (64, 12, 3), (8, 6, 1), (1, 23, 1)],
)
def test_by_default_one_process_per_core_at_most_four_and_one_per_4_gb(
    monkeypatch: pytest.MonkeyPatch, cores: int, gigabytes: int, workers: int
) -> None:
    monkeypatch.delenv("STRATA_TEST_WORKERS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    pages = {"SC_PAGE_SIZE": 1000, "SC_PHYS_PAGES": gigabytes * 1_000_000}
    monkeypatch.setattr(os, "sysconf", pages.__getitem__)
    expected = ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []
    assert dev._test_workers() == expected
