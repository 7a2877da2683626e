"""The query endpoint over TLS with a bearer token (real Kafka, one worker): the client and
the CLI with the CA file and the token are answered; without the token 401; plain HTTP is not
served."""

from __future__ import annotations

import json
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from kafka_fixtures import wait_until
from test_query import send_events
from worker_support import WorkerThread, reservation

from fifolane.cli import cli
from fifolane.client import StateClient, member_urls
from fifolane.config import Settings
from fifolane.errors import ConfigError
from services.worker import WorkerOptions

pytestmark = pytest.mark.integration


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_tls_and_bearer_token(settings: Settings, topics: Any, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    send_events(settings, [("reservation", reservation("R1", "F1", 4), "upsert")])
    with WorkerThread(settings, worker_id="t1", query_port=0, query_tls_cert=cert, query_tls_key=key,
                      query_token_file=token):
        url = wait_until(lambda: member_urls(settings), timeout=60, message="t1 serving")[0]
        assert url.startswith("https://127.0.0.1:")
        with StateClient([url], token="s3cret-token", verify=str(cert)) as client:
            e = wait_until(lambda: client.get("reservation", "R1", group="F1"), timeout=60)
            assert e.version == 4
        ca = ssl.create_default_context(cafile=str(cert))
        r = httpx.get(f"{url}/v1/entities/reservation/R1", params={"group": "F1"}, verify=ca)
        assert r.status_code == 401
        assert r.json() == {"status": "unauthorized",
                            "error": "a valid 'Authorization: Bearer <token>' header is required"}
        r = httpx.get(f"{url}/v1/routing", headers={"Authorization": "Bearer wrong"}, verify=ca)
        assert r.status_code == 401
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https://", "http://") + "/v1/routing")
        res = CliRunner().invoke(cli, ["get", "reservation", "R1", "--group", "F1", "--json", "--url", url,
                                       "--token-file", str(token), "--ca-file", str(cert)])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["version"] == 4


def test_tls_needs_cert_and_key_and_a_token_file_with_a_token(settings: Settings, tmp_path: Path) -> None:
    from services.worker.runtime import Worker

    cert, _key = _self_signed(tmp_path)
    with pytest.raises(ConfigError, match="needs both --query-tls-cert and --query-tls-key"):
        Worker(settings, options=WorkerOptions(worker_id="x", query_port=0, query_tls_cert=cert))
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(ConfigError, match=f"the query token file {empty} is empty"):
        Worker(settings, options=WorkerOptions(worker_id="x", query_port=0, query_token_file=empty))
    with pytest.raises(ConfigError, match="standby replicas serve and hand over through the query endpoint"):
        WorkerOptions(worker_id="x", standby_replicas=1)
