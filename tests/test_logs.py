"""First compiler error and log tail: what a failed build shows."""

from __future__ import annotations

from pathlib import Path

from torchkiln.process.logs import first_error, log_name, tail


def test_first_error_prefers_the_first_compiler_error_over_later_noise() -> None:
    lines = [
        "[1/3] c++ -c a.cpp",
        "FAILED: build/b.o",
        "c++ -c b.cpp -o build/b.o",
        "/src/csrc/b.cpp:7:3: error: 'undeclared_thing' was not declared in this scope",
        "/src/csrc/b.cpp:9:1: error: expected ';' before '}' token",
        "ninja: build stopped: subcommand failed.",
        "error: command '/usr/bin/ninja' failed with exit code 1",
    ]
    assert first_error(lines) == lines[3]


def test_first_error_falls_back_to_the_failed_edge() -> None:
    assert first_error(["ok", "FAILED: x.o", "ninja: build stopped"]) == "FAILED: x.o"
    assert first_error(["all good"]) is None


def test_nvcc_and_cmake_errors() -> None:
    assert first_error(["nvcc fatal   : Unsupported gpu architecture 'compute_50'"]).startswith("nvcc fatal")
    assert first_error(["-- x", "CMake Error at CMakeLists.txt:3 (find_package):"]).startswith("CMake Error")


def test_tail_and_log_name(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(log, 3) == ["line 97", "line 98", "line 99"]
    assert tail(tmp_path / "missing.log") == []
    assert log_name("torch:fetch:fetch-ref") == "torch-fetch-fetch-ref.log"


def test_git_and_python_failures_have_a_first_error_too() -> None:
    git = [
        "# torch:fetch:fetch-ref: git fetch",
        "fatal: unable to access 'https://github.com/x/': Could not resolve host",
    ]
    assert first_error(git) == git[1]
    setup = [
        "Traceback (most recent call last):",
        '  File "setup.py", line 5',
        "ModuleNotFoundError: No module named 'torch'",
    ]
    assert first_error(setup) == setup[2]


def test_each_run_keeps_its_logs_and_latest_links_the_last(tmp_path: Path) -> None:
    from torchkiln.process.logs import KEEP_RUNS, start_run_logs

    logs = tmp_path / "logs"
    first = start_run_logs(logs, "20260101T000000Z")
    (first / "torch-wheel.log").write_text("cold build\n")
    second = start_run_logs(logs, "20260101T000000Z")  # same second: a directory of its own
    assert second != first and (first / "torch-wheel.log").read_text() == "cold build\n"
    assert (logs / "latest").resolve() == second.resolve()
    for i in range(KEEP_RUNS + 3):
        start_run_logs(logs, f"20260102T{i:06d}Z")
    runs = [p for p in logs.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == KEEP_RUNS and not first.exists(), "only the newest runs are kept"
    assert (logs / "latest").resolve().name == f"20260102T{KEEP_RUNS + 2:06d}Z"
