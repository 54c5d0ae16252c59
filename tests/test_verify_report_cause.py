"""``summary.json``'s ``cause``: every failure message of the suite that names its cause gets it, whoever
wrote the message (report.CAUSE_MARKERS lists the writers; each is built here by its own code, with generated
causes) -- the DDP launch that hung on an unresolvable hostname first of all, whose cause was null."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_describe import facts

from torchkiln.verify import buildconfig, hang, report

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
    assert report.cause_line(message) == "; ".join(causes).strip()


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
    assert summary["failures"][0]["cause"] == cause
    assert f"cause: `{cause}" in report.render_markdown(summary)


def test_a_hung_launch_without_a_cause_found_gives_its_first_error_line() -> None:
    message = hang.report("torchrun --standalone", "", "INFO start\nRuntimeError: store timed out\n", 120, [])
    assert report.cause_line(message) == "RuntimeError: store timed out"


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


def test_a_message_that_is_its_own_cause_has_none() -> None:
    assert (
        report.cause_line("accelerator.cuda: CUDA version (torch.version.cuda): expected 12.6, actual 13.0")
        is None
    )
