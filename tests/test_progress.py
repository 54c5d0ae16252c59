"""Ninja/Make progress lines turned into percent and ETA (with an injected clock: tests never time)."""

from __future__ import annotations

from torchkiln.build.progress import CompileProgress, format_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ninja_lines_give_percent_and_eta() -> None:
    clock = FakeClock()
    progress = CompileProgress(clock)
    first = progress.feed("[1/101] Building CXX object caffe2/CMakeFiles/torch_cpu.dir/a.cpp.o\n")
    assert first is not None and first.done == 1 and first.total == 101 and first.eta is None
    clock.now += 50.0  # 10 more edges in 50 s -> 5 s/edge, 90 left -> 450 s
    p = progress.feed("[11/101] Building CXX object caffe2/CMakeFiles/torch_cpu.dir/b.cpp.o")
    assert p is not None
    assert round(p.percent, 1) == round(100 * 11 / 101, 1)
    assert p.eta == 450.0
    assert p.describe() == "11/101 (11%, ETA 7m30s)"


def test_non_progress_lines_are_ignored() -> None:
    progress = CompileProgress(FakeClock())
    for line in ("-- USE_CUDA : OFF", "[W] warning", "In file included from [1/2].h", "[3/2] bogus", ""):
        assert progress.feed(line) is None
    assert progress.latest is None


def test_a_projects_ninja_runs_are_one_progress() -> None:
    """torchvision builds _C (26 edges) then image (17): 26/26 is followed by 27/43, never by 1/17 (6 %)."""
    clock = FakeClock()
    progress = CompileProgress(clock)
    progress.feed("[1/26] a")
    clock.now += 25.0
    done = progress.feed("[26/26] z")
    assert done is not None and (done.done, done.total, done.eta) == (26, 26, 0.0)
    clock.now += 30.0  # setuptools links _C and starts the next extension: not an edge
    p = progress.feed("[1/17] image a")
    assert p is not None and (p.done, p.total, p.runs) == (27, 43, 2)
    assert p.eta == 16.0, "the rate so far (1 s per edge), not the gap between the runs"
    assert p.describe() == "27/43 (63%, ETA 16s)" and p.counts() == "27/43, ETA 16s"


def test_eta_is_smoothed_against_one_slow_edge() -> None:
    clock = FakeClock()
    progress = CompileProgress(clock)
    progress.feed("[1/100] a")
    for done in range(2, 50):
        clock.now += 2.0
        progress.feed(f"[{done}/100] x")
    steady = progress.latest
    assert steady is not None and steady.eta == 51 * 2.0
    clock.now += 60.0  # one heavy translation unit
    p = progress.feed("[50/100] heavy")
    assert p is not None and p.eta is not None
    assert p.eta < 2 * steady.eta, "one slow edge does not multiply the ETA"
    clock.now += 0.1  # then a burst of cached edges
    p = progress.feed("[60/100] burst")
    assert p is not None and p.eta is not None and p.eta > 40 * 1.0, "nor does a burst collapse it"


def test_make_percent_lines() -> None:
    progress = CompileProgress(FakeClock())
    p = progress.feed("[ 90%] Building CXX object caffe2/CMakeFiles/torch_cpu.dir/x.cpp.o")
    assert p is not None and p.percent == 90.0


def test_format_duration() -> None:
    assert format_duration(5) == "5s"
    assert format_duration(65) == "1m05s"
    assert format_duration(3 * 3600 + 120) == "3h02m"


def test_phases_of_a_wheel_step_move_forward_only() -> None:
    from torchkiln.build.progress import PhaseTracker

    clock = FakeClock()
    phases = PhaseTracker(clock)
    assert phases.phase == "configure"
    clock.now += 12.0
    assert phases.feed("-- Configuring done (14.4s)") is None
    assert phases.feed("-- Build files have been written to: /src/pytorch/build") == "compile"
    clock.now += 100.0
    assert phases.feed("[1/2] c++ -c a.cpp") is None
    assert phases.feed("[2/2] c++ -c b.cpp") is None
    assert phases.feed("-- Configuring done") is None  # CMake re-run from ninja: still the compile
    assert phases.feed("installing to build/bdist.linux-x86_64/wheel") == "wheel"
    clock.now += 3.0
    assert phases.feed("[1/1] late edge") is None, "never back to an earlier phase"
    assert phases.finish() == {"configure": 12.0, "compile": 100.0, "wheel": 3.0}


def test_scikit_build_core_packaging_is_the_wheel_phase() -> None:
    from torchkiln.build.progress import PhaseTracker

    phases = PhaseTracker(FakeClock())
    phases.feed("[4567/4567] Linking CXX shared library lib/libtorch_cpu.so")
    assert phases.feed("*** Installing project into wheel...") == "wheel"


def test_setuptools_build_ext_starts_the_compile_before_ninja_reports() -> None:
    from torchkiln.build.progress import PhaseTracker

    clock = FakeClock()
    phases = PhaseTracker(clock)
    clock.now += 2.0
    assert phases.feed("running build_ext") == "compile"
    clock.now += 30.0  # ninja prints [1/2] only when the first object is finished
    assert phases.feed("[1/2] c++ -c a.cpp") is None
    assert phases.finish() == {"configure": 2.0, "compile": 30.0}


def test_nothing_is_drawn_after_the_final_message() -> None:
    import io

    from rich.console import Console

    from torchkiln.build.display import Display
    from torchkiln.build.progress import Progress
    from torchkiln.plan.model import Step

    out = io.StringIO()
    display = Display(Console(file=out, force_terminal=False, width=120))
    step = Step("torchvision:wheel", "compile", "torchvision", ("true",))
    display.live_bar(step)
    display.compile_progress(Progress(13, 26, 10.0, 10.0))
    display.close()  # the build failed: its message (with "full log:") comes next
    shown = out.getvalue()
    display.phase("wheel")
    display.compile_progress(Progress(26, 26, 20.0, 0.0))
    assert out.getvalue() == shown, "no bar or progress line after the final message"
    assert shown.count("%") == 1, "the percentage once"
