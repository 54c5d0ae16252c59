"""pytest plugin of the torchkiln verification suite.

Runs against whatever torch is importable. Options:

* ``--recipe FILE``: also check the build against what the recipe asked for (versions, CUDA, cuDNN,
  NCCL, BLAS, MAGMA, arch list, ...). The recipe is loaded with torchkiln's recipe model; an invalid one
  is a usage error.
* ``--manifest FILE``: also check that the installed torch/torchvision are the wheels a build's
  ``manifest.json`` lists (versions, commits, the wheel's sha256, the installed files).
* ``--provenance FILE --key PUB``: also check the signed provenance statement ``torchkiln build`` wrote
  (``dist/<recipe>.intoto.jsonl``): its signature by the key, and that the installed wheels are its
  subjects (versions, commits, sha256, files); ``verify/test_provenance.py``.
* ``--require-cuda`` / ``--no-require-cuda``: whether a CUDA-only check (marker ``cuda``) that would be
  skipped fails instead. Neither given: required exactly when torch is a CUDA build and this machine has an
  NVIDIA GPU (:mod:`torchkiln.verify.gpuhost`: device nodes, the driver's /proc entries, nvidia-smi), where
  a skipped CUDA check means CUDA is broken. The decision and its reason are in the header and the report.
* ``--report DIR``: write ``junit.xml``, ``summary.json`` (per-area pass/fail/skip counts and the
  environment) and ``summary.md`` into DIR, each atomically.
* ``--parity-reference FILE``: the parity battery's result in upstream's wheel (``torchkiln verify
  --compare-with REQ`` makes it); the ``parity`` area compares this build with it (``verify/test_parity.py``)
  and runs only with it.

Every test belongs to exactly one area (a marker named in :data:`torchkiln.verify.report.AREAS`).
"""

from __future__ import annotations

import os

# cuBLAS reads this when it initialises; deterministic GEMMs on torch <= 2.9 need it. Set before any
# test can touch CUDA; harmless on newer releases and on CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import dataclasses  # noqa: E402
import functools  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from torchkiln.verify.proc import SCRATCH_ENV, scratch_environment, scratch_parent, worker_environment  # noqa: E402

# The suite writes nothing outside its report directory and its own temp directory: `torchkiln verify` gives
# it one (proc.scratch_environment: TMPDIR and every cache variable); run as plain pytest, it makes its own
# here, before torch is imported (inductor reads tempfile.gettempdir() once, for its precompiled headers), and
# removes it when the run ends (pytest_unconfigure).
OWN_SCRATCH: Path | None = None
if not os.environ.get(SCRATCH_ENV):
    OWN_SCRATCH = Path(tempfile.mkdtemp(prefix="torchkiln-verify-", dir=scratch_parent("torchkiln-verify-")))
    os.environ.update(scratch_environment(OWN_SCRATCH))
    tempfile.tempdir = None  # read TMPDIR again
    sys.dont_write_bytecode = True

import pytest  # noqa: E402
import torch  # noqa: E402

from torchkiln.verify import gpuhost, hang, report  # noqa: E402

HELPERS = Path(__file__).resolve().parent / "helpers"
RECIPE_KEY = pytest.StashKey[object]()
MANIFEST_KEY = pytest.StashKey[object]()
PROVENANCE_KEY = pytest.StashKey[object]()
PARITY_KEY = pytest.StashKey[object]()
STATE_KEY = pytest.StashKey[dict]()
REQUIRE_KEY = pytest.StashKey[tuple[bool, str]]()  # (CUDA required, why): gpuhost.require_cuda
REQUIRED = "CUDA is required"  # how a required CUDA check that could not run starts its failure

EXTRA_MARKERS = {
    "cuda": "needs a CUDA device: skipped without one, a failure under --require-cuda",
    "multi_gpu": "needs at least two visible CUDA devices",
    "cpu_build": "checks how a torch built without CUDA behaves (skipped on CUDA builds)",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchkiln verify")
    group.addoption(
        "--recipe",
        metavar="FILE",
        default=None,
        help="check the build against this recipe (a path or a shipped recipe name)",
    )
    group.addoption(
        "--manifest",
        metavar="FILE",
        default=None,
        help="check the installed wheels against this manifest.json of torchkiln build",
    )
    group.addoption(
        "--provenance",
        metavar="FILE",
        default=None,
        help="check the installed wheels against this signed provenance statement (needs --key)",
    )
    group.addoption(
        "--key",
        metavar="PUB",
        default=None,
        help="the PEM public key the provenance statement is signed with",
    )
    group.addoption(
        "--require-cuda",
        action="store_true",
        default=None,
        help="fail, instead of skipping, every CUDA-only check that cannot run (default: when torch is a "
        "CUDA build and this machine has an NVIDIA GPU)",
    )
    group.addoption(
        "--no-require-cuda",
        action="store_false",
        dest="require_cuda",
        default=None,
        help="let CUDA-only checks that cannot run skip, even on a machine with an NVIDIA GPU",
    )
    group.addoption(
        "--report", metavar="DIR", default=None, help="write junit.xml, summary.json and summary.md into DIR"
    )
    group.addoption(
        "--parity-reference",
        metavar="FILE",
        default=None,
        help="compare this build's numerics with this parity battery result (torchkiln verify --compare-with)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, text in report.AREAS.items():
        config.addinivalue_line("markers", f"{name}: verify area '{text}'")
    for name, text in EXTRA_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if not config.pluginmanager.hasplugin("timeout"):
        # Subprocess timeouts are the real guard; keep the per-test marker valid without pytest-timeout.
        config.addinivalue_line("markers", "timeout(seconds): per-test limit (pytest-timeout)")
    config.stash[RECIPE_KEY] = _load_recipe(config.getoption("recipe"))
    config.stash[MANIFEST_KEY] = _load_manifest(config.getoption("manifest"))
    config.stash[PROVENANCE_KEY] = _load_provenance(config.getoption("provenance"), config.getoption("key"))
    config.stash[PARITY_KEY] = _load_parity(config.getoption("parity_reference"))
    try:  # read by test_ddp.py at import: a bad value is named here, once
        hang.launch_deadline(os.environ)
        hang.launch_port(os.environ)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[REQUIRE_KEY] = gpuhost.require_cuda(
        config.getoption("require_cuda"), cuda_build=torch.version.cuda is not None, host=gpuhost.detect()
    )
    state: dict = {
        "outcomes": {},
        "durations": {},
        "start": time.monotonic(),
        "exit_status": None,
        "junit_tmp": None,
    }
    config.stash[STATE_KEY] = state
    report_dir = config.getoption("report")
    if report_dir is not None:
        directory = Path(report_dir)
        if directory.exists() and not directory.is_dir():
            raise pytest.UsageError(
                f"--report {report_dir}: exists and is not a directory (valid: a directory)"
            )
        directory.mkdir(parents=True, exist_ok=True)
        if not config.option.xmlpath:  # an explicit --junitxml wins
            tmp = directory / f".junit.xml.{os.getpid()}.tmp"
            config.option.xmlpath = str(tmp)
            state["junit_tmp"] = tmp


def _load_recipe(value: str | None) -> object:
    from torchkiln.recipe.loader import load_recipe, resolve_recipe_path

    return _load("--recipe", value, "invalid recipe", lambda v: load_recipe(resolve_recipe_path(v)))


def _load_manifest(value: str | None) -> object:
    from torchkiln.artifacts.manifest import load_manifest

    return _load("--manifest", value, "cannot be used", lambda v: load_manifest(Path(v)))


def _load_provenance(statement: str | None, key: str | None) -> object:
    """(path, envelope, public key), or None; either option without the other is a usage error."""
    if statement is None and key is None:
        return None
    if statement is None or key is None:
        raise pytest.UsageError(
            "--provenance FILE and --key PUB go together (the statement and its signer's key)"
        )
    from torchkiln.artifacts.signing import load_envelope, load_public_key
    from torchkiln.errors import UsageError

    try:
        return (Path(statement), load_envelope(Path(statement)), load_public_key(Path(key)))
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def _load_parity(value: str | None) -> object:
    """The reference side's battery result, or None; a file that is not one is a usage error."""
    if value is None:
        return None
    from torchkiln.errors import UsageError
    from torchkiln.verify import parity

    try:
        return parity.load(Path(value), "--parity-reference")
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def _load(option: str, value: str | None, what: str, loader: Callable[[str], object]) -> object:
    """``loader(value)``; a problem with it is a usage error naming the option (pytest exit status 4)."""
    if value is None:
        return None
    from torchkiln.errors import ProblemsError

    try:
        return loader(value)
    except ProblemsError as exc:
        raise pytest.UsageError(f"{option} {value}: {what}:\n{exc}") from None


# ------------------------------------------------------------------------------------------------------
# CUDA gating: skip without a device, fail under --require-cuda.
# ------------------------------------------------------------------------------------------------------


def cuda_unavailable_reason(required: bool = False) -> str | None:
    """Why a CUDA check cannot run here. ``required``: CUDA must work (a GPU host, or --require-cuda), so
    the reason is a failure's and says what torch reports of CUDA's initialisation."""
    if torch.version.cuda is None:
        return f"needs CUDA: torch {torch.__version__} is built without CUDA"
    if torch.cuda.is_available():
        return None
    unusable = (
        f"needs CUDA: torch is built with CUDA {torch.version.cuda} but no device is usable "
        "(torch.cuda.is_available() is False)"
    )
    if required:
        cause = cuda_init_error()
        return unusable + (f"; torch.cuda.init(): {cause}" if cause else "")
    return unusable + "; without a GPU this check cannot tell a working CUDA build from a broken one"


@functools.cache
def cuda_init_error() -> str | None:
    """Why CUDA does not initialise, in torch's words (``torch.cuda.init()``: "Found no NVIDIA driver on
    your system ...", "The NVIDIA driver on your system is too old ..."); None when it does."""
    try:
        torch.cuda.init()
    except Exception as exc:  # noqa: BLE001 - RuntimeError or AssertionError, by torch version
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return None


def cuda_required(config: pytest.Config) -> tuple[bool, str]:
    """(whether a CUDA check that cannot run is a failure, why): decided once in pytest_configure."""
    return config.stash.get(REQUIRE_KEY, (bool(config.getoption("require_cuda")), "--require-cuda"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cuda") is not None:
        reason = cuda_unavailable_reason(required=cuda_required(item.config)[0])
        if reason:
            pytest.skip(reason)
    if item.get_closest_marker("multi_gpu") is not None and torch.cuda.device_count() < 2:
        reason = f"needs at least 2 visible CUDA devices, {torch.cuda.device_count()} visible"
        # with one GPU the check does not apply to this machine; with none, the GPU is what is missing
        pytest.skip(report.not_applicable(reason) if torch.cuda.device_count() else reason)
    if item.get_closest_marker("cpu_build") is not None:
        if torch.version.cuda is not None:
            pytest.skip(f"checks a CPU-only build; torch is built with CUDA {torch.version.cuda}")
        if getattr(torch.version, "hip", None):
            pytest.skip(f"checks a CPU-only build; torch is built with ROCm {torch.version.hip}")


def _area(item: pytest.Item) -> str:
    names = [m.name for m in item.iter_markers() if m.name in report.AREAS]
    return names[0] if names else "unassigned"


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only what runs must be in exactly one area
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash[PARITY_KEY] is None:  # the parity area compares with upstream's run: none, no area
        parity = [item for item in items if item.get_closest_marker("parity") is not None]
        if parity:
            config.hook.pytest_deselected(items=parity)
            items[:] = [item for item in items if item.get_closest_marker("parity") is None]
    for item in items:
        names = {m.name for m in item.iter_markers() if m.name in report.AREAS}
        if len(names) != 1:
            raise pytest.UsageError(
                f"{item.nodeid}: needs exactly one area marker of {sorted(report.AREAS)}, has {sorted(names)}"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201 - hookwrapper
    outcome = yield
    rep = outcome.get_result()
    config = item.config
    required, why = cuda_required(config)
    if rep.skipped and item.get_closest_marker("cuda") is not None and required:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reason = reason.removeprefix("Skipped: ")
        multi_gpu_only = item.get_closest_marker("multi_gpu") is not None and torch.cuda.is_available()
        # One GPU cannot run a two-GPU check, and a check of what this build, torch or GPU lacks (its reason
        # says "not applicable: ...") has nothing to run: neither is CUDA being broken.
        if not multi_gpu_only and not reason.startswith(report.NOT_APPLICABLE):
            rep.outcome = "failed"
            rep.longrepr = f"{REQUIRED} ({why}): this CUDA check could not run: {reason}"
    if rep.when == "setup" and rep.failed and (_required(rep) or _verdict(call)):
        # A check's verdict given before its body runs (--require-cuda, a fixture's pytest.fail such as
        # "torchvision is not installed, but the recipe builds it"): a failure, not an error, in pytest's
        # own summary and in junit.xml too.
        rep.when = "call"
    _record(config, item, rep)


def _required(rep: pytest.TestReport) -> bool:
    return isinstance(rep.longrepr, str) and rep.longrepr.startswith(f"{REQUIRED} (")


def _verdict(call: pytest.CallInfo) -> bool:  # type: ignore[type-arg]
    return call.excinfo is not None and call.excinfo.errisinstance(pytest.fail.Exception)


def _skip_reason(rep: pytest.TestReport) -> str:
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    return reason.removeprefix("Skipped: ")


def _record(config: pytest.Config, item: pytest.Item, rep: pytest.TestReport) -> None:
    """One outcome per test over its phases: a failing setup/teardown is an error, time adds up."""
    state = config.stash[STATE_KEY]
    state["durations"][item.nodeid] = state["durations"].get(item.nodeid, 0.0) + rep.duration
    outcomes: dict[str, report.Outcome] = state["outcomes"]
    if rep.skipped:
        outcome, message = "skipped", _skip_reason(rep)
    elif rep.failed:
        outcome = "failed" if rep.when == "call" or _required(rep) else "error"
        message = _failure_message(rep)
    elif rep.when == "call":
        outcome, message = "passed", ""
    else:
        return  # a passing setup or teardown changes nothing
    if rep.when == "teardown" and not rep.failed:
        return
    outcomes[item.nodeid] = report.Outcome(item.nodeid, _area(item), outcome, message)


def _failure_message(rep: pytest.TestReport) -> str:
    crash = getattr(rep.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).removeprefix("Failed: ")  # pytest.fail(msg) is reported as "Failed: msg"
    return str(rep.longrepr).strip().splitlines()[-1] if rep.longrepr else "failed"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[STATE_KEY]["exit_status"] = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    """After junitxml wrote its file (sessionfinish): move it into place and write the summaries; remove the
    temp directory the suite made for itself."""
    try:
        _write_report(config)
    finally:
        if OWN_SCRATCH is not None:
            shutil.rmtree(OWN_SCRATCH, ignore_errors=True)


def _write_report(config: pytest.Config) -> None:
    report_dir = config.getoption("report", None)
    if report_dir is None or STATE_KEY not in config.stash:
        return
    state = config.stash[STATE_KEY]
    directory = Path(report_dir)
    junit_tmp: Path | None = state["junit_tmp"]
    if junit_tmp is not None and junit_tmp.exists():
        os.replace(junit_tmp, directory / "junit.xml")
    recipe = config.stash.get(RECIPE_KEY, None)
    manifest = config.getoption("manifest", None)
    options = {
        "recipe": str(getattr(recipe, "path", "")) or None,
        "manifest": str(Path(manifest).resolve()) if manifest else None,
        "recipe_sha256": getattr(recipe, "sha256", None),
        "require_cuda": cuda_required(config)[0],
        "require_cuda_reason": cuda_required(config)[1],
        "compare_with": compare_with(config),
        "args": list(config.invocation_params.args),
    }
    exit_status = state["exit_status"] if state["exit_status"] is not None else 1
    outcomes = [
        dataclasses.replace(o, duration_s=round(state["durations"].get(o.nodeid, 0.0), 3))
        for o in state["outcomes"].values()
    ]
    summary = report.summarize(
        outcomes,
        environment=report.environment(),
        exit_status=exit_status,
        options=options,
        duration_s=time.monotonic() - state["start"],
    )
    report.write_summary(directory, summary)


# ------------------------------------------------------------------------------------------------------
# Fixtures.
# ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def recipe(pytestconfig: pytest.Config) -> object:
    """The recipe given with --recipe, or None."""
    return pytestconfig.stash[RECIPE_KEY]


@pytest.fixture(scope="session")
def provenance(pytestconfig: pytest.Config) -> object:
    """(path, envelope, public key) given with --provenance and --key, or None."""
    return pytestconfig.stash[PROVENANCE_KEY]


@pytest.fixture(scope="session")
def manifest(pytestconfig: pytest.Config) -> object:
    """The manifest given with --manifest, or None."""
    return pytestconfig.stash[MANIFEST_KEY]


@pytest.fixture(scope="session")
def parity_reference(pytestconfig: pytest.Config) -> object:
    """The upstream side's parity battery result given with --parity-reference, or None."""
    return pytestconfig.stash[PARITY_KEY]


@pytest.fixture(scope="session")
def helpers() -> Path:
    """Directory of the helper scripts the suite runs in fresh processes."""
    return HELPERS


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for helper processes: inherited under the suite's policy (what it sets, removes and
    keeps: :func:`torchkiln.verify.proc.worker_environment`)."""
    return worker_environment(os.environ)


@pytest.fixture(autouse=True)
def _restore_torch_state():  # noqa: ANN202 - generator fixture
    """Determinism, cuDNN and thread settings are process-global: give every test the state it found."""
    import torch.utils.deterministic as tud

    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        tud.fill_uninitialized_memory,
        torch.get_num_threads(),
        torch.get_default_dtype(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    yield
    now = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if now != saved[:2]:  # the call imports torch._inductor.config (about 1 s): only when it changed
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]
    tud.fill_uninitialized_memory = saved[4]
    torch.set_num_threads(saved[5])
    torch.set_default_dtype(saved[6])
    if (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) != saved[7:9]:
        # only the legacy TF32 API, and only when a test changed it: mixing it with the new
        # fp32_precision API makes later queries raise.
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[7], saved[8]


def pytest_report_header(config: pytest.Config) -> list[str]:
    recipe = config.stash.get(RECIPE_KEY, None)
    required, why = cuda_required(config)
    compared = compare_with(config)
    return [
        f"torchkiln verify: torch {torch.__version__} ({torch.version.git_version}) from "
        f"{Path(torch.__file__).parent}, CUDA {torch.version.cuda}, python {sys.version.split()[0]}",
        f"recipe: {getattr(recipe, 'path', None) or 'none'}",
        f"require-cuda: {'yes' if required else 'no'} ({why})",
        *(
            [f"compare-with: torch {compared['reference_torch']}: {compared['notice'] or 'the same release'}"]
            if compared
            else []
        ),
    ]


def compare_with(config: pytest.Config) -> dict | None:
    """What the parity area compares with (--parity-reference): upstream's torch, and whether it is this
    build's release (:func:`torchkiln.verify.parity.release_notice`); None without one."""
    from torchkiln.verify import parity

    reference = config.stash.get(PARITY_KEY, None)
    if not isinstance(reference, dict):
        return None
    theirs = str(reference.get("torch", {}).get("version"))
    notice = parity.release_notice(str(torch.__version__), theirs)
    return {"reference_torch": theirs, "same_release": notice is None, "notice": notice}
