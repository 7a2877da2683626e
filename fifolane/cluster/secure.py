"""The files of a secured Kafka (``fifolane kafka up --secure``, docker-compose profile ``secure``).

Everything lives in one folder (``<home>/kafka/secure/`` locally, git-ignored; a volume in
docker-compose), made once and reused:

    ca.pem              the CA certificate clients trust (``FIFOLANE_SSL_CA_LOCATION``)
    ca.p12              the CA's key pair (PKCS12): it signs the broker certificate
    broker.p12          the brokers' key pair and certificate chain (PKCS12), for TLS
    secrets.json        the store password and every SCRAM user's password (mode 0600)
    clients/<user>.toml fifolane settings of each user (``FIFOLANE_CONFIG=...``)
    clients/<user>.properties  the same for Java clients (Kafka's CLI tools, Spark)

Certificates are made with the JDK's ``keytool`` (Java is needed for Kafka anyway): no crypto
of our own. The broker certificate names every host clients use (``localhost``, ``127.0.0.1``
and, in docker-compose, the broker's host name), so clients verify it (librdkafka and the
Java client check the host name by default).

Listeners: the client listener speaks SASL_SSL with SCRAM-SHA-512 and is also the
inter-broker listener (the brokers log in as the super user ``broker``); the controller
listener (127.0.0.1 or the compose network only) speaks SASL_PLAINTEXT with PLAIN and the same
user. Authorization: KRaft's ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``:
a principal may do only what an ACL allows (``fifolane acls apply``). ``admin`` is a super user
for set-up (topics, users, ACLs). SCRAM users are added when the storage is formatted
(``kafka-storage format --add-scram``), so they exist before the first broker starts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fifolane.errors import ClusterError

__all__ = [
    "ADMIN_USER",
    "BROKER_USER",
    "DEFAULT_USERS",
    "SCRAM_MECHANISM",
    "SecureFiles",
    "compose_node_properties",
    "ensure_secure_files",
    "find_keytool",
]

SCRAM_MECHANISM = "SCRAM-SHA-512"
#: the brokers' own user (inter-broker and controller connections): a super user
BROKER_USER = "broker"
#: the set-up user (topics, users, ACLs): a super user
ADMIN_USER = "admin"
#: users made with the cluster: one per role of docs/security.md, besides admin and broker
DEFAULT_USERS = ("producer", "worker", "listener-admin", "listener-reader", "spark")
_VALIDITY_DAYS = 825
# keytool is a JVM start per call: a small, quick JVM (no JIT tiers beyond C1, serial GC).
_FAST_JVM = ("-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", "-J-Xshare:auto")


def find_keytool() -> str:
    """The JDK's keytool: ``$JAVA_HOME/bin/keytool``, else the one on ``PATH``."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "keytool") if java_home else shutil.which("keytool")
    if not found or not Path(found).exists():
        raise ClusterError("keytool not found: install a Java 17+ JDK or JRE (it ships keytool) or set JAVA_HOME")
    return found


@dataclass(frozen=True)
class SecureFiles:
    """The folder of a secured cluster's certificates and passwords (see the module docstring)."""

    dir: Path

    @property
    def ca_pem(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.dir / "broker.p12"

    @property
    def secrets_file(self) -> Path:
        return self.dir / "secrets.json"

    def _secrets(self) -> dict[str, Any]:
        try:
            data = json.loads(self.secrets_file.read_text())
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read {self.secrets_file} ({exc}): remove {self.dir} and "
                               "start the cluster again with --fresh") from exc
        if not isinstance(data, dict) or not isinstance(data.get("users"), dict):
            raise ClusterError(f"{self.secrets_file} is not what `fifolane kafka up --secure` wrote")
        return data

    @property
    def store_password(self) -> str:
        return str(self._secrets()["store_password"])

    def users(self) -> dict[str, str]:
        """SCRAM users and their passwords (admin, broker and the role users)."""
        return {str(k): str(v) for k, v in self._secrets()["users"].items()}

    def complete(self) -> bool:
        """Were all files made (a run killed half-way leaves an incomplete folder)?"""
        return all(p.is_file() for p in (self.ca_pem, self.keystore, self.secrets_file))

    # -- the broker ----------------------------------------------------------------------------
    def broker_properties(self, client: str = "CLIENT", controller: str = "CONTROLLER") -> dict[str, str]:
        """Security settings of a broker+controller node whose listeners are named ``client``
        (SASL_SSL, SCRAM, also inter-broker) and ``controller`` (SASL_PLAINTEXT, PLAIN)."""
        users = self.users()
        broker_pw = users[BROKER_USER]
        c, k = client.lower(), controller.lower()
        scram_module = "org.apache.kafka.common.security.scram.ScramLoginModule"
        plain_module = "org.apache.kafka.common.security.plain.PlainLoginModule"
        return {
            "listener.security.protocol.map": f"{client}:SASL_SSL,{controller}:SASL_PLAINTEXT",
            "inter.broker.listener.name": client,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            f"listener.name.{c}.sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.{c}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config":
                f'{scram_module} required username="{BROKER_USER}" password="{broker_pw}";',
            "sasl.mechanism.controller.protocol": "PLAIN",
            f"listener.name.{k}.sasl.enabled.mechanisms": "PLAIN",
            f"listener.name.{k}.plain.sasl.jaas.config":
                f'{plain_module} required username="{BROKER_USER}" password="{broker_pw}" '
                f'user_{BROKER_USER}="{broker_pw}";',
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.keystore),
            "ssl.keystore.password": self.store_password,
            "ssl.key.password": self.store_password,
            # The brokers are TLS clients of each other (replication): they trust the CA.
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_pem),
            "ssl.client.auth": "none",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{BROKER_USER};User:{ADMIN_USER}",
        }

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments that add every SCRAM user at bootstrap."""
        return [arg for name, pw in sorted(self.users().items())
                for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={pw}]")]

    # -- clients -------------------------------------------------------------------------------
    def client_settings(self, user: str, bootstrap: str | None = None) -> dict[str, str]:
        """fifolane settings (Settings field -> value) of ``user``."""
        users = self.users()
        if user not in users:
            raise ClusterError(f"no SCRAM user {user!r} in {self.secrets_file}; known: {', '.join(sorted(users))}")
        settings = {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": SCRAM_MECHANISM,
            "sasl_username": user,
            "sasl_password": users[user],
            "ssl_ca_location": str(self.ca_pem),
        }
        return {"bootstrap_servers": bootstrap, **settings} if bootstrap else settings

    def librdkafka_config(self, user: str) -> dict[str, str]:
        """librdkafka's keys for ``user`` (what :meth:`fifolane.config.Settings.kafka_config` makes)."""
        s = self.client_settings(user)
        return {"security.protocol": s["security_protocol"], "sasl.mechanism": s["sasl_mechanism"],
                "sasl.username": s["sasl_username"], "sasl.password": s["sasl_password"],
                "ssl.ca.location": s["ssl_ca_location"]}

    def java_client_properties(self, user: str, bootstrap: str | None = None) -> dict[str, str]:
        """The same for Java clients (Kafka's CLI tools: ``--command-config``)."""
        s = self.client_settings(user, bootstrap)
        props = {
            "security.protocol": s["security_protocol"],
            "sasl.mechanism": s["sasl_mechanism"],
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                                f'username="{user}" password="{s["sasl_password"]}";',
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": s["ssl_ca_location"],
        }
        return {"bootstrap.servers": bootstrap, **props} if bootstrap else props

    def write_client_files(self, bootstrap: str | None = None) -> dict[str, Path]:
        """``clients/<user>.toml`` and ``clients/<user>.properties`` for every user but the
        brokers' own; returns the TOML files by user."""
        out = self.dir / "clients"
        out.mkdir(mode=0o700, exist_ok=True)
        made = {}
        for user in sorted(self.users()):
            if user == BROKER_USER:
                continue
            toml = "".join(f'{k} = {json.dumps(v)}\n' for k, v in self.client_settings(user, bootstrap).items())
            _write_private(out / f"{user}.toml", f"# fifolane settings of SCRAM user {user}: FIFOLANE_CONFIG=<this file>\n{toml}")
            java = "".join(f"{k}={v}\n" for k, v in self.java_client_properties(user, bootstrap).items())
            _write_private(out / f"{user}.properties", java)
            made[user] = out / f"{user}.toml"
        return made


def compose_node_properties(files: SecureFiles, host: str, data_dir: str = "/var/lib/kafka/data") -> str:
    """``server.properties`` of docker-compose's single secured node (profile ``secure``): the
    client listener on ``host``:9092 (containers), a second SASL_SSL listener on :19092
    published as localhost:29092 (the host), the controller on :9093. Replication 1."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:9093",
        "listeners": "CLIENT://:9092,HOST://:19092,CONTROLLER://:9093",
        "advertised.listeners": f"CLIENT://{host}:9092,HOST://localhost:29092",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": data_dir,
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        **{k: "1" for k in ("default.replication.factor", "min.insync.replicas",
                            "offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                            "transaction.state.log.min.isr")},
        **files.broker_properties(),
    }
    # The HOST listener: the same SASL_SSL and SCRAM as the client listener.
    props["listener.security.protocol.map"] += ",HOST:SASL_SSL"
    props["listener.name.host.sasl.enabled.mechanisms"] = SCRAM_MECHANISM
    props[f"listener.name.host.{SCRAM_MECHANISM.lower()}.sasl.jaas.config"] = \
        props[f"listener.name.client.{SCRAM_MECHANISM.lower()}.sasl.jaas.config"]
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by the owner only (passwords)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def _keytool(keytool: str, *args: str, cwd: Path, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run([keytool, *_FAST_JVM, *args], cwd=cwd, input=stdin, capture_output=True,
                          timeout=180, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"keytool {args[0]} failed (exit {proc.returncode}): "
                           f"{(proc.stdout + proc.stderr).decode(errors='replace').strip()[-800:]}")
    return proc.stdout


def _make_certificates(d: Path, hosts: Iterable[str], password: str) -> None:
    """A CA and a broker key pair signed by it, for ``hosts`` (DNS names or IP addresses)."""
    keytool = find_keytool()
    san = ",".join(f"ip:{h}" if h.replace(".", "").isdigit() or ":" in h else f"dns:{h}"
                   for h in dict.fromkeys(hosts))
    store = ("-storetype", "PKCS12", "-storepass", password)
    key = ("-keyalg", "EC", "-groupname", "secp256r1")

    def ca() -> None:
        _keytool(keytool, "-genkeypair", "-alias", "ca", "-dname", "CN=fifolane local CA", *key,
                 "-validity", "3650", "-ext", "bc:c", "-keystore", "ca.p12", *store, cwd=d)
        _keytool(keytool, "-exportcert", "-rfc", "-alias", "ca", "-keystore", "ca.p12", *store,
                 "-file", "ca.pem", cwd=d)

    def broker() -> None:
        _keytool(keytool, "-genkeypair", "-alias", "broker", "-dname", "CN=fifolane broker", *key,
                 "-validity", str(_VALIDITY_DAYS), "-keystore", "broker.p12", *store, cwd=d)

    with ThreadPoolExecutor(2) as pool:  # two independent JVM starts
        for future in [pool.submit(ca), pool.submit(broker)]:
            future.result()
    csr = _keytool(keytool, "-certreq", "-alias", "broker", "-keystore", "broker.p12", *store, cwd=d)
    signed = _keytool(keytool, "-gencert", "-rfc", "-alias", "ca", "-keystore", "ca.p12", *store,
                      "-validity", str(_VALIDITY_DAYS), "-ext", f"SAN={san}",
                      "-ext", "KU=digitalSignature", "-ext", "EKU=serverAuth,clientAuth",
                      cwd=d, stdin=csr)
    # The reply: the signed certificate followed by the CA's, so keytool installs the chain.
    (d / "broker-chain.pem").write_bytes(signed + (d / "ca.pem").read_bytes())
    _keytool(keytool, "-importcert", "-noprompt", "-trustcacerts", "-alias", "broker",
             "-keystore", "broker.p12", *store, "-file", "broker-chain.pem", cwd=d)
    (d / "broker-chain.pem").unlink()


def ensure_secure_files(folder: Path, hosts: Iterable[str] = ("localhost", "127.0.0.1"),
                        users: Iterable[str] = DEFAULT_USERS) -> tuple[SecureFiles, bool]:
    """Make the certificates and passwords in ``folder`` unless they are complete there;
    returns them and whether they were made now (SCRAM users are then new too)."""
    files = SecureFiles(Path(folder))
    if files.complete():
        return files, False
    # Made in a sub-folder, then moved in, secrets.json last (it marks the folder complete):
    # the folder itself may be a mount point (docker-compose's volume), so it stays.
    files.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = files.dir / ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    password = secrets.token_urlsafe(24)
    _make_certificates(tmp, hosts, password)
    (tmp / "ca.pem").chmod(0o644)
    for name in ("ca.p12", "broker.p12"):
        (tmp / name).chmod(0o600)
    for name in ("ca.p12", "broker.p12", "ca.pem"):
        os.replace(tmp / name, files.dir / name)
    shutil.rmtree(tmp, ignore_errors=True)
    names = dict.fromkeys([ADMIN_USER, BROKER_USER, *users])
    _write_private(files.secrets_file, json.dumps({
        "store_password": password,
        "users": {name: secrets.token_urlsafe(18) for name in names},
    }, indent=2))
    return files, True
