"""Several reshape processes starting at once on one `--confdir` (issue 15, finding 10): each
reads whole files only, and they all end up with one CA.

Two levels: the start-up steps that write under the confdir (`reshape.app.runtime.prepare`: the
CA, the trust bundle) run in many real processes at once, many times, while others keep loading
what is there; and two `reshape run` processes started at the same moment both come up with the
same CA.
"""

from __future__ import annotations

import multiprocessing
import re
import ssl
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from labkit.pki import OriginPKI
from reshape.app.authority import init_ca, load_ca
from reshape.upstream.trust import write_trust_bundle
from tests.support.reshape_process import StartProxy

PROCESSES = 6
ROUNDS = 25


def _start_up(confdir: str, extra_ca: str, at: float) -> str:
    """From wall-clock time `at`: what `prepare` writes, then what mitmproxy and the engine read.
    Returns the CA's fingerprint."""
    time.sleep(max(0.0, at - time.time()))
    fingerprint = ""
    for _ in range(ROUNDS):
        ca, _ = init_ca(Path(confdir))
        fingerprint = ca.sha256_fingerprint
        bundle = write_trust_bundle(Path(confdir), Path(extra_ca))
        ssl.create_default_context(cafile=str(bundle))  # "PEM lib" on a half-written bundle
        load_ca(Path(confdir))
    return fingerprint


@pytest.mark.slow
def test_processes_starting_at_once_read_whole_files_and_share_one_ca(
    tmp_path: Path, origin_pki: OriginPKI
) -> None:
    confdir = tmp_path / "conf"
    at = time.time() + 3.0  # every process started and waiting by then
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(PROCESSES, mp_context=context) as pool:
        futures = [
            pool.submit(_start_up, str(confdir), str(origin_pki.ca_cert_path), at)
            for _ in range(PROCESSES)
        ]
        fingerprints = {future.result(timeout=120) for future in futures}
    assert len(fingerprints) == 1, fingerprints
    leftovers = [
        p.name for p in confdir.iterdir() if p.name.startswith(".") and "lock" not in p.name
    ]
    assert leftovers == []


@pytest.mark.slow
def test_two_reshape_runs_starting_at_once_come_up_with_one_ca(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    confdir = tmp_path / "conf"
    runs = [start_reshape(confdir=confdir, wait=False) for _ in range(2)]
    for run in runs:
        run.wait_healthy()
    for run in runs:
        run.stop()
    lines = [re.search(r"CA (created|loaded) .*SHA-256 (\S+)", run.log()) for run in runs]
    assert all(lines), [run.log() for run in runs]
    assert sorted(m.group(1) for m in lines if m) == ["created", "loaded"]
    assert len({m.group(2) for m in lines if m}) == 1
