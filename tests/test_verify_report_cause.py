"""``summary.json``'s ``cause``: every failure message of the suite that names its cause gets it, whoever
wrote the message (report.CAUSE_MARKERS lists the writers; each is built here by its own code, with generated
causes) -- the DDP launch that hung on an unresolvable hostname first of all, whose cause was null."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_describe import facts

from torchkiln.verify import buildconfig, hang, parity, report

# A cause as a writer words it: one line, no trailing dot (a message ends its sentence with one).
CAUSES = (
    st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=80)
    .map(str.strip)
    .filter(lambda t: bool(t) and not t.endswith("."))
)
TAILS = st.lists(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60), max_size=5)


@settings(deadline=None)  # the machine is shared: timings vary
@given(st.lists(CAUSES, min_size=1, max_size=3), TAILS, TAILS)
def test_a_hung_launch_names_its_likely_cause(
    causes: list[str], stdout: list[str], stderr: list[str]
) -> None:
    message = hang.report("torchrun --standalone", "\n".join(stdout), "\n".join(stderr), 120, causes)
    first = hang.first_rank_error("\n".join(stdout), "\n".join(stderr))
    said = "; ".join([*causes, *([f"{hang.FIRST_ERROR}{first}"] if first else [])])
    assert report.cause_line(message) == said.strip().removesuffix(".").strip()


def test_the_unresolvable_hostname_case() -> None:
    """The message a hostname that does not resolve gives (tests/test_verify_ddp_hang.py runs it for real)."""
    host = "kiln-verify.invalid"
    cause = (
        f"this machine's hostname {host!r} does not resolve (getaddrinfo: Name or service not known): torchrun "
        f"gives its workers the agent's hostname as MASTER_ADDR, and they wait for it forever; map it in "
        f"/etc/hosts (e.g. '127.0.1.1 {host}') or in DNS"
    )
    stderr = f"[W] The IPv6 network addresses of ({host}, 29500) cannot be retrieved (gai error: -2 - Name or service not known)"
    message = hang.report("two-node torchrun", "", stderr, 120, [cause])
    summary = report.summarize(
        [report.Outcome("verify/test_ddp.py::test_two_nodes_c10d", "ddp", "failed", message)],
        environment={}, exit_status=1, options={}, duration_s=1.0,
    )  # fmt: skip
    first = f"{hang.FIRST_ERROR}[W] The IPv6 network addresses of ({host}, 29500) cannot be retrieved (gai error: -2 - Name or service not known)"
    assert summary["failures"][0]["cause"] == f"{cause}; {first}"
    assert f"| `{cause}; {first}` |" in report.render_markdown(summary)


def test_a_hung_launch_without_a_cause_found_gives_its_first_error_line() -> None:
    message = hang.report("torchrun --standalone", "", "INFO start\nRuntimeError: store timed out\n", 120, [])
    assert report.cause_line(message) == f"{hang.FIRST_ERROR}RuntimeError: store timed out"


@settings(deadline=None)  # the machine is shared: timings vary
@given(CAUSES)
def test_a_required_cuda_check_names_torchs_words(cause: str) -> None:
    """verify/conftest.py's message for a CUDA check that could not run where CUDA is required."""
    reason = (
        "needs CUDA: torch is built with CUDA 13.0 but no device is usable (torch.cuda.is_available() is "
        f"False); torch.cuda.init(): {cause}"
    )
    message = f"CUDA is required (--require-cuda was given): this CUDA check could not run: {reason}"
    assert report.cause_line(message) == cause


@settings(deadline=None)  # the machine is shared: timings vary
@given(CAUSES)
def test_a_probe_that_raised_is_its_cause(cause: str) -> None:
    cudnn = buildconfig.self_checks(facts(cudnn_error=cause, cudnn_runtime=None))["cudnn_runtime"]
    nccl = buildconfig.self_checks(facts(nccl_version=None, nccl_error=cause))["nccl_in_cuda_build"]
    assert (cudnn.status, nccl.status) == ("fail", "fail")
    assert report.cause_line(cudnn.message) == cause
    assert report.cause_line(nccl.message) == cause


def test_a_message_that_is_its_own_cause_is_its_first_line() -> None:
    """Every failure has a cause: a recipe mismatch names field, expected and actual, and is its own."""
    own = "accelerator.cuda: CUDA version (torch.version.cuda): expected 12.6, actual 13.0"
    assert report.cause_line(own) == own
    assert report.cause_line(f"\n{own}\nmore") == own
    assert report.cause_line("") is None


def test_a_cause_with_backticks_stays_one_code_span() -> None:
    message = "a `quoted` thing | with a pipe\nline two"
    summary = report.summarize(
        [report.Outcome("verify/test_x.py::test_y", "release", "failed", message)],
        environment={}, exit_status=1, options={}, duration_s=1.0,
    )  # fmt: skip
    assert "| ``a `quoted` thing \\| with a pipe`` |" in report.render_markdown(summary)


def test_a_long_message_is_cut_saying_so_and_its_cause_is_not() -> None:
    cause = "x" * 1500
    message = f"head; cause: {cause}\n" + "y" * 3000
    summary = report.summarize(
        [report.Outcome("verify/test_x.py::test_y", "release", "failed", message)],
        environment={}, exit_status=1, options={}, duration_s=1.0,
    )  # fmt: skip
    text = report.render_markdown(summary)
    assert f"`{cause}`" in text and "(cut: the whole message is in summary.json)" in text
    assert summary["failures"][0]["message"] == message


@pytest.mark.parametrize(
    ("mine", "theirs", "cause"),
    [
        ("2.13.0+cpu", "2.13.0+cu130", None),
        (
            "2.13.0+cpu",
            "2.12.1+cpu",
            "the reference is another release: torch 2.12.1 (2.12.1+cpu), this build",
        ),
        (
            "2.13.0",
            "2.14.0",
            "the reference is another release: torch 2.14.0 (2.14.0), this build torch 2.13.0",
        ),
    ],
)
def test_a_parity_failure_against_another_release_names_it_as_its_cause(
    mine: str, theirs: str, cause: str | None
) -> None:
    wrong = ["matmul/cpu/float32 out: max abs 0.5, max rel 0.1 (outside rtol 1e-05, atol 1e-05)"]
    message = parity.failure(mine, theirs, wrong)
    assert message.startswith(f"torch {mine} differs from upstream's {theirs}: {wrong[0]}")
    found = report.cause_line(message)
    if cause is None:  # the same release: the difference is its own cause
        assert found == message
    else:
        assert found is not None and found.startswith(cause), found
