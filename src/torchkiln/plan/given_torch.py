"""``--torch WHEEL|REQ``: build torchvision alone against a torch the user already has.

Without it, ``--only torchvision`` installs exactly the recipe's torch (``torch==2.13.0+cpu.kiln1``), which
exists only where an earlier torchkiln build left it. With it, the build env gets the given torch (a wheel
file, or a requirement pinned with ``==``), after a check that it pairs with the recipe's torchvision
(torch 2.N <-> torchvision 0.(N+15) up to 2.14, 2.15 <-> 0.29: data/compat.toml) and suits its accelerator; torchvision's
``PYTORCH_VERSION`` (its wheel's torch requirement) is that torch's version, and the manifest records what
was used (the wheel's sha256).

What a given torch *is* is found out before any step, not assumed from how it was written: the same
``torch==2.13.0`` is upstream's CUDA 13.0 build on PyPI (version ``2.13.0``, 9.6 GB of NVIDIA wheels with
it) and a CPU build where the configured index or find-links offer ``2.13.0+cpu``. A wheel file is read
(its ``torch/version.py``, else its METADATA); a requirement is handed to pip as install-torch will hand
it (``pip install --dry-run --report``, the recipe's Python, the same find-links: pip reads the index's
metadata, nothing is installed or, where the index serves metadata, downloaded). A torch whose accelerator
does not suit the recipe (a CUDA build for a CPU recipe, a CPU build for a CUDA one, another CUDA minor) is
refused, naming ``--torch`` and what would do.
"""

from __future__ import annotations

import configparser
import contextlib
import importlib.util
import json
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from torchkiln.artifacts.wheelfile import parse
from torchkiln.errors import UsageError
from torchkiln.files.digests import file_sha256
from torchkiln.process import runner
from torchkiln.recipe.compat import compat, minor, torch_release_range, vision_pairs
from torchkiln.recipe.loader import recipes_dir
from torchkiln.recipe.model import Recipe

from .records import Records, file_identity

VALID = "a torch wheel file, or a requirement such as torch==2.13.0"
RESOLVE_TIMEOUT_S = 300.0

# How a torch wheel's METADATA names its CUDA (when its version has no +cuXYZ label, as upstream's PyPI
# wheels): the runtime it requires, pinned to the toolkit release it was built with.
#   cuda-toolkit[...]==13.0.3            torch 2.12.0 and 2.13.0 (cuda-toolkit ...==13.0.2 / ==13.0.3)
#   nvidia-cuda-runtime-cu12==12.8.90    torch 2.9.0 (2.6.0: nvidia-cuda-runtime-cu12 (==12.4.127))
CUDA_RUNTIME = re.compile(r"^(cuda-toolkit|nvidia-cuda-runtime(-cu\d+)?)$")
# torch/version.py of every torch wheel: ``cuda: Optional[str] = '13.0'`` (None for a CPU build).
VERSION_PY_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class GivenTorch:
    """The torch torchvision is built against: what pip installs, its version, and the manifest's note."""

    install: str  # a wheel path or a requirement: pip's argument
    version: Version
    note: str

    @property
    def find_links(self) -> str | None:
        """The wheel's directory, for the post-build check's pip (None for a requirement: the index)."""
        return str(Path(self.install).parent) if self.install.endswith(".whl") else None


@dataclass(frozen=True)
class Found:
    """What a given torch really is: its version, its CUDA (None: a CPU build), and how that was learnt."""

    version: Version
    cuda: str | None
    how: str  # "its torch/version.py says cuda = '13.0'", ...
    wheel: str  # the wheel's file name


# A wheel name the shell left as the user typed it: a pattern (glob(7)) that matched no file.
GLOB = re.compile(r"[*?\[]")


def _no_wheel(text: str, recipe: Recipe | None) -> str:
    """``no such file``, said of a pattern no file matched too, and what to do where the wheel could not be
    downloaded (PyTorch's index unreachable): a wheel file from elsewhere, or PyPI's build with a CUDA recipe."""
    unmatched = (
        " (a pattern the shell passes on as it is when no file matches it)" if GLOB.search(text) else ""
    )
    pypi = "PyPI's torch==VERSION (upstream's CUDA build) with a CUDA recipe of that release"
    if recipe is not None:
        cuda = [
            r.stem
            for r in sorted(recipes_dir().glob("*.toml"))
            if r.stem.startswith(f"torch-{minor(recipe.torch.version)}-cu") and "aarch64" not in r.stem
        ]
        pypi = (
            f"PyPI's torch=={recipe.torch.version} (upstream's CUDA build: --torch checks its CUDA against the "
            f"recipe's) with a CUDA recipe{f' ({_or(cuda)})' if cuda else f' of torch {minor(recipe.torch.version)}'}"
        )
    return (
        f"--torch {text!r}: no such file{unmatched}; where PyTorch's index (download.pytorch.org) cannot be "
        f"reached to download the wheel: --torch with a torch wheel file you have (an earlier build's dist/, a "
        f"copy from another machine), or {pypi} (valid: {VALID})"
    )


def _or(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _version(
    text: str, records: Records | None = None, recipe: Recipe | None = None
) -> tuple[str, Version, str]:
    """(what pip installs, the version, how it was given) of ``--torch TEXT``; UsageError when unusable. A
    wheel file that is not there is said to be missing before its name is read (a pattern no file matched is
    no wheel name), unless it names another project's wheel."""
    if text.endswith(".whl"):
        path = Path(text).absolute()
        name = parse(path.name)
        other = name is not None and canonicalize_name(name.distribution) != "torch"
        if not other and not path.is_file():
            raise UsageError(_no_wheel(text, recipe))
        if name is None or other:
            raise UsageError(f"--torch {text!r}: not a torch wheel file name (valid: {VALID})")
        try:
            version = Version(name.version)
        except InvalidVersion:
            raise UsageError(
                f"--torch {text!r}: {name.version!r} is not a version (valid: {VALID})"
            ) from None
        return str(path), version, f"wheel {path.name} (sha256 {_wheel_sha256(path, records)})"
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        if ("/" in text or GLOB.search(text)) and not Path(text).exists():  # a path, not a requirement
            raise UsageError(_no_wheel(text, recipe)) from None
        raise UsageError(f"--torch {text!r}: {exc} (valid: {VALID})") from None
    pins = [s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
    if canonicalize_name(req.name) != "torch" or len(pins) != 1 or req.url or req.marker:
        raise UsageError(f"--torch {text!r}: not torch pinned to one version with == (valid: {VALID})")
    try:  # '===' compares strings: its value need not be a version at all
        version = Version(pins[0].version)
    except InvalidVersion:
        raise UsageError(f"--torch {text!r}: {pins[0].version!r} is not a version (valid: {VALID})") from None
    return str(req), version, f"requirement {req} (from the configured index)"


def python_tags(python: str, platforms: Sequence[str]) -> frozenset[Tag]:
    """The wheel tags CPython ``python`` (``3.13``, ``3.13t`` free-threaded) installs on ``platforms``, in
    pip's terms (packaging.tags): its own ABI, the stable ABI where it applies, pure-Python wheels."""
    free = python.endswith("t")
    major, minor_ = (int(x) for x in python.rstrip("t").split("."))
    abi = f"cp{major}{minor_}{'t' if free else ''}"
    tags = set(cpython_tags((major, minor_), abis=[abi], platforms=platforms))
    tags |= set(compatible_tags((major, minor_), interpreter=f"cp{major}{minor_}", platforms=platforms))
    return frozenset(tags)


def _check_python_tags(text: str, path: Path, version: Version, recipe: Recipe) -> None:
    """A torch wheel file installs on the Pythons its name's tags say (``cp311-cp311``): one for another
    Python than the build's is refused by name, before anything runs (pip would refuse it in the
    install-torch step, after the env steps)."""
    try:
        _, _, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename:
        return  # not a name pip reads: pip's to judge
    platforms = sorted({t.platform for t in tags})
    missing = [p for p in recipe.python_versions if not tags & python_tags(p, platforms)]
    if not missing:
        return
    shown = ", ".join(sorted({f"{t.interpreter}-{t.abi}" for t in tags}))
    field = "python.versions" if recipe.pythons else "python.version"
    want = ", ".join(missing)
    theirs = sorted(
        {f"{m.group(1)}.{m.group(2)}" for t in tags if (m := re.fullmatch(r"cp(\d)(\d+)", t.interpreter))}
    )
    if len(recipe.python_versions) > 1:  # one file serves one CPython: the requirement, resolved per Python
        download = f": --torch 'torch=={version}' (pip takes each Python's wheel from the index that has it)"
    elif not missing[0].endswith("t"):
        download = (
            f": pip download --no-deps --only-binary=:all: --python-version {missing[0]} --dest DIR "
            f"'torch=={version}' (from the index that has it)"
        )
    else:
        download = ""
    other = (
        f"; or a recipe for the wheel's Python: torchkiln recipe new RECIPE --python {theirs[0]}"
        if theirs
        else ""
    )
    raise UsageError(
        f"--torch {text!r}: a wheel for {shown}, which the build's Python {want} ({field}) cannot install (valid: torch "
        f"{version}'s wheel for Python {want}{download}{other})"
    )


def _check_pairing(text: str, version: Version, recipe: Recipe) -> None:
    """torch pairs with the recipe's torchvision as data/compat.toml says (0.(N+15) with 2.N up to 2.14; 2.15
    with 0.29); a release without data is said to be one."""
    release = compat()["torch"].get(minor(version))
    if release is None:
        raise UsageError(
            f"--torch {text!r}: there is no compatibility data for torch {minor(version)}, so torchkiln "
            f"cannot tell what it pairs with (data/compat.toml has {torch_release_range()}) (valid: a torch "
            f"{minor(recipe.torch.version)}.x, which pairs with the recipe's torchvision "
            f"{recipe.torchvision.version})"
        )
    if not vision_pairs(release, recipe.torchvision.version):
        wanted = f"torch {minor(recipe.torch.version)}.x (the torch release data/compat.toml pairs it with)"
        raise UsageError(
            f"--torch {text!r}: torch {version} does not pair with the recipe's torchvision "
            f"{recipe.torchvision.version} (valid: {wanted})"
        )


def _label(cuda: str | None) -> str:
    """A build's accelerator as PyTorch labels its wheels: ``cpu``, ``cu130`` (CUDA 13.0)."""
    return "cpu" if cuda is None else "cu" + cuda.replace(".", "")


def _label_cuda(local: str) -> tuple[bool, str | None]:
    """(whether a local version label names the accelerator, its CUDA): ``cpu`` -> (True, None),
    ``cu126`` -> (True, "12.6"), anything else -> (False, None)."""
    if local.startswith("cpu"):
        return True, None
    match = re.match(r"^cu(\d+)(\d)(?:\.|$)", local)
    return (True, f"{match.group(1)}.{match.group(2)}") if match else (False, None)


def suited_requirement(recipe: Recipe, version: Version | None = None) -> tuple[str, str]:
    """The requirement of the torch build that suits ``recipe``'s accelerator, at ``version``'s release (the
    recipe's torch by default), and the PyTorch index that has it: (``torch===2.13.0+cpu``,
    ``https://download.pytorch.org/whl/cpu``). Every message that suggests a ``--torch`` requirement names
    this one, which :func:`resolve_given_torch` accepts wherever the index offers it."""
    release = (version or recipe.torch.version).base_version
    cuda = recipe.accelerator.cuda
    label = "cpu" if cuda is None else _label(f"{cuda.major}.{cuda.minor}")
    return f"torch==={release}+{label}", f"https://download.pytorch.org/whl/{label}"


def _valid(recipe: Recipe, version: Version) -> str:
    requirement, index = suited_requirement(recipe, version)
    release = version.base_version
    cuda = recipe.accelerator.cuda
    if cuda is None:
        return (
            f"a CPU build of torch {release}: {requirement} from PyTorch's CPU index (pip "
            f"--extra-index-url {index}), or a CPU torch wheel file"
        )
    return (
        f"a CUDA {cuda} build of torch {release}: {requirement} from PyTorch's index {index}, or such a "
        "torch wheel file"
    )


def _check_accelerator(text: str, subject: str, found: Found, recipe: Recipe) -> None:
    cuda = recipe.accelerator.cuda
    want = None if cuda is None else f"{cuda.major}.{cuda.minor}"
    if found.cuda == want:
        return
    recipe_label = _label(want)
    raise UsageError(
        f"--torch {text!r}: {subject}: a {_label(found.cuda)} build of torch for a {recipe_label} recipe "
        f"({found.how}) (valid: {_valid(recipe, found.version)})"
    )


def _metadata_cuda(version: Version, requires: Sequence[str]) -> tuple[str | None, str]:
    """A torch's CUDA from its version and METADATA requirements (None: a CPU build), and how it was read."""
    named, cuda = _label_cuda(version.local or "")
    if named:
        return cuda, f"its version's local label +{version.local}"
    for line in requires:
        try:
            req = Requirement(line)
            applies = req.marker is None or req.marker.evaluate({"extra": ""})
        except (InvalidRequirement, UndefinedEnvironmentName):
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if applies and CUDA_RUNTIME.match(canonicalize_name(req.name)) and pins:
            runtime = Version(pins[0])
            return f"{runtime.major}.{runtime.minor}", f"its METADATA requires {req.name}=={pins[0]}"
    return None, "its METADATA requires no CUDA runtime and its version has no +cuXYZ label"


def read_wheel(path: Path) -> Found:
    """What a torch wheel file is: its METADATA version, and its CUDA from ``torch/version.py`` (what
    ``torch.version.cuda`` will say), else from its METADATA."""
    try:
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            metadata = next(
                (n for n in names if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None
            )
            if metadata is None:
                raise UsageError(
                    f"--torch {str(path)!r}: no .dist-info/METADATA in the wheel (valid: {VALID})"
                )
            text = wheel.read(metadata).decode("utf-8", "replace")
            version_py = (
                wheel.read("torch/version.py").decode("utf-8", "replace")
                if "torch/version.py" in names
                else None
            )
    except (OSError, zipfile.BadZipFile) as exc:
        raise UsageError(f"--torch {str(path)!r}: not a readable wheel ({exc}) (valid: {VALID})") from None
    fields = [line.split(":", 1) for line in text.split("\n\n", 1)[0].splitlines() if ":" in line]
    version = Version(next((v.strip() for k, v in fields if k == "Version"), "0"))
    match = VERSION_PY_CUDA.search(version_py or "")
    if match is not None:
        cuda = match.group(1) or match.group(2)
        return Found(version, cuda or None, f"its torch/version.py says cuda = {cuda!r}", path.name)
    cuda, how = _metadata_cuda(version, [v.strip() for k, v in fields if k == "Requires-Dist"])
    return Found(version, cuda, how, path.name)


def _wheel_sha256(path: Path, records: Records | None) -> str:
    """The wheel's sha256, read back while the file is the one hashed (its identity: a torch wheel is 0.2 to
    2.5 GB, hashed once, not on every run)."""
    key = Records.key("torch-wheel-sha256", {"file": file_identity(path)}) if records else None
    kept = records.get(key) if records and key else None
    if kept is not None and isinstance(kept.get("sha256"), str):
        return str(kept["sha256"])
    sha = file_sha256(path)
    if records and key:
        records.put(key, {"sha256": sha})
    return sha


def _read_wheel(path: Path, records: Records | None) -> Found:
    """:func:`read_wheel`, read back while the file is the one read."""
    key = Records.key("torch-wheel-read", {"file": file_identity(path), "code": _code()}) if records else None
    kept = _found(records.get(key)) if records and key else None
    if kept is not None:
        return kept
    found = read_wheel(path)
    if records and key:
        records.put(key, _answer(found))
    return found


def _code() -> str | None:
    return file_identity(__file__)


def _answer(found: Found, url: str = "") -> dict[str, Any]:
    answer: dict[str, Any] = {"version": str(found.version), "cuda": found.cuda, "how": found.how}
    answer |= {"wheel": found.wheel, "url": url}
    if url.startswith("file://"):
        answer["file"] = file_identity(unquote(urlparse(url).path))
    return answer


def _found(answer: dict[str, Any] | None) -> Found | None:
    if not answer:
        return None
    try:
        return Found(Version(answer["version"]), answer["cuda"], str(answer["how"]), str(answer["wheel"]))
    except (KeyError, TypeError, InvalidVersion):
        return None


# pip's configuration files (pip's docs, "Configuration"): site-wide, per user, per environment; the
# environment's is that of the interpreter running pip (torchkiln's own).
def _pip_config_files(environ: Mapping[str, str]) -> list[str]:
    home = Path(environ.get("HOME", "~")).expanduser()
    xdg_dirs = environ.get("XDG_CONFIG_DIRS") or "/etc/xdg"
    files = [str(Path(d) / "pip" / "pip.conf") for d in xdg_dirs.split(os.pathsep) if d]
    files += ["/etc/pip.conf", str(home / ".pip" / "pip.conf")]
    files.append(str(Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"))
    files.append(str(Path(sys.prefix) / "pip.conf"))
    if environ.get("PIP_CONFIG_FILE"):
        files.append(environ["PIP_CONFIG_FILE"])
    return files


def _configured_find_links(environ: Mapping[str, str], files: Sequence[str]) -> list[str]:
    """The find-links directories pip is configured with (``PIP_FIND_LINKS``, ``find-links`` of the
    configuration files' ``[global]`` and ``[install]``), as pip splits them (whitespace)."""
    found = environ.get("PIP_FIND_LINKS", "").split()
    parser = configparser.RawConfigParser()
    for path in files:
        with contextlib.suppress(OSError, configparser.Error):
            parser.read(path, encoding="utf-8")
    for section in ("global", "install"):
        if parser.has_option(section, "find-links"):
            found += parser.get(section, "find-links").split()
    return [unquote(urlparse(d).path) if d.startswith("file://") else d for d in found]


def _resolution_key(text: str, python: str, find_links: Sequence[Path]) -> str:
    """What pip's answer for ``text`` depends on: the requirement, the Python, the torch wheels in every
    find-links directory (install-torch's and pip's configured ones: a new wheel there is a new answer),
    pip's configuration (every ``PIP_*`` variable, every configuration file by its identity) and pip
    itself. An index's content is not in it: :func:`_still_there` checks that the wheel is still there."""
    environ = os.environ
    spec = importlib.util.find_spec("pip")
    config = _pip_config_files(environ)
    directories = [str(d) for d in find_links] + _configured_find_links(environ, config)
    # the torch wheels found, not the directories' names: another work directory's empty wheelhouse and
    # dist/ are the same answer (the configured directories are in pip's configuration below)
    torch_files = sorted(
        {
            (p.name, file_identity(p))
            for d in directories
            if Path(d).is_dir()
            for p in Path(d).glob("torch-*.whl")
        },
        key=str,
    )
    return Records.key(
        "torch-resolution",
        {
            "requirement": text,
            "python": python,
            "find_links": torch_files,
            "pip_env": {k: v for k, v in sorted(environ.items()) if k.startswith("PIP_")},
            "pip_config": {f: file_identity(f) for f in config},
            "pip": file_identity(spec.origin) if spec and spec.origin else None,
            "code": _code(),
        },
    )


HEAD_TIMEOUT_S = 5.0


def _still_there(answer: Mapping[str, Any]) -> bool:
    """Whether the wheel a recorded resolution named is still where pip found it: a local file with the same
    identity, or a URL that answers a HEAD request (any doubt: asked again)."""
    url = str(answer.get("url", ""))
    if url.startswith("file://"):
        return answer.get("file") is not None and file_identity(unquote(urlparse(url).path)) == answer["file"]
    if not url.startswith(("https://", "http://")):
        return False
    import ssl  # noqa: PLC0415 - only for a recorded resolution from an index over HTTP
    import urllib.request  # noqa: PLC0415

    cert = os.environ.get("PIP_CERT")
    context = ssl.create_default_context(cafile=cert if cert and Path(cert).is_file() else None)
    try:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=HEAD_TIMEOUT_S, context=context) as response:
            return 200 <= int(response.status) < 400
    except (OSError, ValueError):
        return False


def resolve_requirement(
    text: str, python: str, find_links: Sequence[Path] = (), records: Records | None = None
) -> Found:
    """:func:`ask_pip`, unless ``records`` hold its answer for the same requirement, Python, find-links and
    pip configuration, and the wheel it named is still there: a no-op rebuild does not ask the index."""
    key = _resolution_key(text, python, find_links) if records else None
    kept = records.get(key) if records and key else None
    if kept is not None and _still_there(kept):
        found = _found(kept)
        if found is not None:
            return found
    found, url = ask_pip(text, python, find_links)
    if records and key:
        records.put(key, _answer(found, url))
    return found


def ask_pip(text: str, python: str, find_links: Sequence[Path] = ()) -> tuple[Found, str]:
    """What pip would install for ``text`` with the configured index, the recipe's Python and ``find_links``
    (what install-torch passes), without installing it: ``pip install --dry-run --report``. A wheel pip
    would take from a directory is read itself; one from an index is known by its metadata."""
    with tempfile.TemporaryDirectory(prefix="torchkiln-torch-") as tmp:
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps"]
        argv += ["--quiet", "--only-binary=:all:", "--python-version", python, "--report", str(report)]
        # pip before 23.1 takes --python-version only with --target; a dry run writes nothing there
        argv += ["--target", str(Path(tmp) / "target")]
        for directory in find_links:
            argv += ["--find-links", str(directory)] if Path(directory).is_dir() else []
        try:
            done = runner.run([*argv, "--", text], timeout=RESOLVE_TIMEOUT_S)
        except runner.ProcessError as exc:
            raise UsageError(
                f"--torch {text!r}: cannot ask pip what it would install ({exc}) (valid: {VALID})"
            ) from None
        if not done.ok or not report.is_file():
            said = [x for x in done.stderr.splitlines() if x.strip() and not x.startswith("WARNING:")]
            reason = said[-1] if said else done.failure()
            raise UsageError(
                f"--torch {text!r}: pip cannot install it for Python {python} ({reason}) (valid: {VALID} the "
                "configured index has)"
            )
        item = json.loads(report.read_text(encoding="utf-8"))["install"][0]
    url = item.get("download_info", {}).get("url", "")
    wheel = unquote(urlparse(url).path.rsplit("/", 1)[-1])
    if url.startswith("file://") and wheel.endswith(".whl"):
        return read_wheel(Path(unquote(urlparse(url).path))), url
    metadata = item.get("metadata", {})
    version = Version(metadata.get("version", "0"))
    cuda, how = _metadata_cuda(version, metadata.get("requires_dist", []))
    return Found(version, cuda, how, wheel), url


def resolve_given_torch(
    text: str,
    recipe: Recipe,
    only: str | None,
    find_links: Sequence[Path] = (),
    records: Records | None = None,
) -> GivenTorch:
    """Check ``--torch TEXT`` against the recipe: it pairs with its torchvision, and what it really is (the
    wheel read, or what pip would install for the requirement, ``find_links`` as install-torch passes
    them) suits its accelerator. ``records``: what was found before, kept by what it depends on
    (:mod:`torchkiln.plan.records`), read back instead of asked again."""
    if only != "torchvision":
        raise UsageError("--torch: only with --only torchvision (a build of torch makes its own)")
    install, version, given = _version(text, records, recipe)
    _check_pairing(text, version, recipe)
    if install.endswith(".whl"):
        _check_python_tags(text, Path(install), version, recipe)
    named, cuda = _label_cuda(version.local or "")
    if named:  # torch==2.13.0+cu130 says what it is: no need to ask anyone
        asked = Found(version, cuda, f"its local version label +{version.local}", "")
        _check_accelerator(text, "the version asked for", asked, recipe)
    if install.endswith(".whl"):
        found = _read_wheel(Path(install), records)
        subject = f"the wheel {found.wheel} (torch {found.version})"
    else:
        found = resolve_requirement(install, recipe.python, find_links, records)
        subject = f"pip would install torch {found.version} ({found.wheel})"
    _check_accelerator(text, subject, found, recipe)
    if install.endswith(".whl"):
        chosen = f"a {_label(found.cuda)} build ({found.how})"
    else:
        chosen = f"pip chose torch {found.version} ({found.wheel}), a {_label(found.cuda)} build"
    note = f"--torch: torchvision built against torch {version}, {given}: {chosen}; not the recipe's own torch build"
    return GivenTorch(install, version, note)
