"""A package index mirror on this machine, for image builds run under emulation: proxpi (a PyPI caching mirror)
serving PyPI over plain HTTP on 127.0.0.1, its files cached in the test cache.

Why: in an arm64 image built on an x86_64 host, pip itself runs under qemu-user, and there TLS and hashing
are what cost: 18 MB/s from PyPI, about 200 s for upstream's aarch64 torch 2.13.0 and its CUDA wheels, against
about 220 MB/s for the same files fetched natively. The mirror fetches natively; the emulated pip reads them
over plain HTTP from it. That is what an air-gapped cluster does with its own mirror (devpi, proxpi,
Artifactory): ``torchkiln images --pip-config FILE`` with an ``index-url`` pointing at it. The image builds see
the host's 127.0.0.1 because torchkiln gives buildah ``--network host``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torchkiln.distributed.loopback import free_port

SERVE = (
    "from werkzeug.serving import run_simple; from proxpi.server import app; "
    "import sys; run_simple('127.0.0.1', int(sys.argv[1]), app, threaded=True)"
)


# proxpi answers 406 to a request that accepts neither of the simple API's forms
ACCEPT = {"Accept": "text/html"}


@contextmanager
def mirror(cache: Path, log: Path) -> Iterator[str]:
    """proxpi serving PyPI from ``cache`` (kept between runs); yields its index URL."""
    cache.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "PROXPI_INDEX_URL": "https://pypi.org/simple/",
        "PROXPI_CACHE_DIR": str(cache),
        "PROXPI_CACHE_SIZE": str(40 * 2**30),
        # proxpi sends a client to the file's upstream URL when its own download takes longer than this: the
        # emulated pip must never fetch from PyPI itself
        "PROXPI_DOWNLOAD_TIMEOUT": "1800",
        "PROXPI_LOGGING_LEVEL": "WARNING",
    }
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}/index/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(
                    urllib.request.Request(url + "pip/", headers=ACCEPT), timeout=30
                ).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"proxpi did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def pip_config(url: str, dest: Path) -> Path:
    """A pip configuration that takes every package from the mirror at ``url``. Without pip's own cache: the
    mirror is the cache, and pip's would keep a second copy of every wheel in the engine's cache mount
    (/var/tmp/buildah-cache/torchkiln-pip), under a new key for each run's port."""
    host = url.split("/")[2].split(":")[0]
    dest.write_text(f"[global]\nindex-url = {url}\ntrusted-host = {host}\nno-cache-dir = true\n")
    return dest
