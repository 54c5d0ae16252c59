"""The post-build check's jobs once pip has installed the wheels (torchkiln.build.observers.InstalledObserver):
started at the check's line saying so, side by side (issue 47), their results or their first error back in
the builder's thread."""

from __future__ import annotations

import threading

import pytest

from torchkiln.build.observers import InstalledObserver
from torchkiln.build.postcheck import INSTALLED


def test_the_jobs_start_at_the_installed_line_and_run_side_by_side() -> None:
    """Each job waits for the other to have started: one after the other, they would never finish."""
    started = {name: threading.Event() for name in ("staged", "portability")}

    def job(name: str, other: str) -> str:
        started[name].set()
        assert started[other].wait(timeout=30), f"{name} ran alone"
        return name

    observer = InstalledObserver({"staged": lambda: job("staged", "portability"), "portability": lambda: job("portability", "staged")})  # fmt: skip
    assert observer("Processing ./torchvision-0.21.0.whl\n") is False
    assert observer.wait() == {}, "nothing before the line"
    assert observer(INSTALLED + "\n") is False
    assert observer(INSTALLED + "\n") is False  # said twice: started once
    assert observer.results() == {"staged": "staged", "portability": "portability"}


def test_a_failed_job_is_raised_in_the_builders_thread_the_first_in_order() -> None:
    def fails(message: str):  # noqa: ANN202
        def job() -> None:
            raise OSError(message)

        return job

    observer = InstalledObserver({"staged": fails("staging"), "portability": fails("reading")})
    observer(INSTALLED + "\n")
    with pytest.raises(OSError, match="^staging$"):
        observer.results()
