"""Fixtures for the remote-storage tests; import the ones a test module uses by name.

moto's S3 server runs once per session on 127.0.0.1 (a real HTTP server; the stores reach
it through ``AWS_ENDPOINT_URL``, exactly like a production endpoint). Each test gets its
own bucket, fake credentials in the environment and fresh fault counters.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.servers import FaultProxy, FileServer

# Distinctive fake credentials, so tests can assert they never leak into messages.
ACCESS_KEY = "AKIATESTINGNOLEAK01"
SECRET_KEY = "wdstream-secret-must-not-leak-0123456789"
SESSION_TOKEN = "wdstream-session-token-must-not-leak"

_bucket_ids = itertools.count()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """URL of a moto S3 server on 127.0.0.1 (one per test session)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, moto_endpoint: str) -> str:
    """Fake credentials and the moto endpoint in the environment; returns the endpoint."""
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_ROLE_ARN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    return moto_endpoint


@pytest.fixture
def fake_credentials() -> tuple[str, str, str]:
    """The fake (access key, secret key, session token) that ``aws_env`` sets."""
    return ACCESS_KEY, SECRET_KEY, SESSION_TOKEN


@pytest.fixture
def s3_bucket(aws_env: str) -> str:
    """A new, empty bucket on the moto server."""
    name = f"wds-test-{next(_bucket_ids)}"
    boto3.client("s3", endpoint_url=aws_env).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def _s3_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    host, port = moto_endpoint.removeprefix("http://").split(":")
    with FaultProxy((host, int(port))) as proxy:
        yield proxy


@pytest.fixture
def s3_proxy(_s3_proxy: FaultProxy) -> FaultProxy:
    """A fault-injecting proxy in front of moto; faults reset for each test."""
    _s3_proxy.faults.reset()
    return _s3_proxy


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[FileServer]:
    """A read/write HTTP file server over a fresh folder, faults off."""
    root = tmp_path / "http-root"
    root.mkdir()
    with FileServer(root) as server:
        yield server
