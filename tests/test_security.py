"""Kafka listeners with TLS and SASL (issue 15, first part) against a real `strata dev`
process and real clients: SCRAM-SHA-512 / SCRAM-SHA-256 / PLAIN over SASL_SSL, client
certificates over SSL, with librdkafka (confluent-kafka and kcat) and kafka-python. Wrong
passwords, unknown users, plaintext to a TLS port, a TLS port without a client certificate,
and requests before authentication are refused, and the broker keeps serving."""

import json
import os
import socket
import ssl
import struct
import subprocess
import time

import pytest

from conftest import free_port, kcat_bin, port_accepts, rdkafka_conf, stop_process, strata_bin
from test_internal_security import pb  # noqa: F401  (the gRPC stubs fixture)

PASSWORD = "s3cret-Pw,=x"  # a comma and an equals sign: SCRAM escapes them


class SecureNode:
    """`strata dev` with four listeners: PLAINTEXT (admin), SASL_SSL, SSL with required
    client certificates, SASL_PLAINTEXT; certificates from `strata certs`."""

    def __init__(self, workdir, auth=""):
        self.bin = strata_bin()
        self.dir = workdir
        self.certs = workdir / "certs"
        subprocess.run([self.bin, "certs", "--out", str(self.certs), "--node", "broker",
                        "--client", "alice"], check=True, capture_output=True)
        self.ports = {name: free_port() for name in ("PLAIN", "SECURE", "MTLS", "SASL")}
        self.controller = free_port()
        self.grpc = free_port()
        listeners = "".join(
            f'[[kafka.listeners]]\nname = "{name}"\nlisten = "127.0.0.1:{port}"\nprotocol = "{proto}"\n'
            + ('client_auth = "required"\n' if name == "MTLS" else "")
            for (name, port), proto in zip(self.ports.items(),
                                           ("PLAINTEXT", "SASL_SSL", "SSL", "SASL_PLAINTEXT")))
        self.config = workdir / "secure.toml"
        self.config.write_text(
            listeners
            + f'[kafka.tls]\ncert = "{self.certs}/node-broker.pem"\nkey = "{self.certs}/node-broker.key"\n'
            + f'client_ca = "{self.certs}/ca.pem"\n' + auth)
        self.log = open(workdir / "strata.log", "ab")
        self.proc = subprocess.Popen(
            [self.bin, "dev", "--config", str(self.config), "--data-dir", str(workdir / "data"),
             "--listen", f"127.0.0.1:{self.ports['PLAIN']}",
             "--controller-listen", f"127.0.0.1:{self.controller}", "--grpc", f"127.0.0.1:{self.grpc}"],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL, env=dict(os.environ, NO_COLOR="1"))
        deadline = time.monotonic() + 30
        while not all(port_accepts(p) for p in self.ports.values()):
            assert self.proc.poll() is None, self.tail()
            assert time.monotonic() < deadline, self.tail()
            time.sleep(0.1)
        # listeners accept before the broker has registered: wait for the registration
        while not self.registered():
            assert self.proc.poll() is None, self.tail()
            assert time.monotonic() < deadline, "the broker never registered:\n" + self.tail()
            time.sleep(0.1)

    def registered(self):
        r = self.cli("quorum", "metadata", "--controller", f"127.0.0.1:{self.controller}", check=False)
        return r.returncode == 0 and any(not b["fenced"] for b in json.loads(r.stdout)["brokers"].values())

    def tail(self):
        return (self.dir / "strata.log").read_text(errors="replace")[-4000:]

    def cli(self, *args, check=True):
        r = subprocess.run([self.bin, *args], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, RUST_BACKTRACE="0"))
        if check:
            assert r.returncode == 0, f"strata {' '.join(args)}: {r.stdout}{r.stderr}"
        return r

    def user(self, *args, check=True):
        return self.cli("user", *args, "--controller", f"127.0.0.1:{self.controller}", check=check)

    def bootstrap(self, listener):
        return f"127.0.0.1:{self.ports[listener]}"

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def node_with_alice(tmp_path, config="[auth]\nallow_everyone_if_no_acl_found = true\n"):
    """A SecureNode with `config`, the SCRAM user alice and the topic `ledger`."""
    n = SecureNode(tmp_path, config)
    pw = tmp_path / "alice.pw"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    n.user("create", "alice", "--password-file", str(pw))
    n.cli("topic", "create", "ledger", "--bootstrap", n.bootstrap("PLAIN"))
    return n


@pytest.fixture
def node(tmp_path):
    # authentication only: resources no ACL names stay open to every authenticated principal
    n = SecureNode(tmp_path, "[auth]\nallow_everyone_if_no_acl_found = true\n")
    try:
        pw = tmp_path / "alice.pw"
        pw.write_text(PASSWORD + "\n")
        pw.chmod(0o644)
        r = n.user("create", "alice", "--password-file", str(pw), check=False)
        assert r.returncode != 0 and "chmod 600" in r.stderr, "a password file others may read was used"
        pw.chmod(0o600)
        n.user("create", "alice", "--password-file", str(pw))
        n.cli("topic", "create", "ledger", "--bootstrap", n.bootstrap("PLAIN"))
        yield n
    finally:
        n.stop()


def sasl_conf(node, mechanism, password=PASSWORD, user="alice"):
    return {"bootstrap.servers": node.bootstrap("SECURE"), "security.protocol": "SASL_SSL",
            "sasl.mechanisms": mechanism, "sasl.username": user, "sasl.password": password,
            "ssl.ca.location": str(node.certs / "ca.pem")}


def rdkafka_roundtrip(conf, values, topic="ledger"):
    from confluent_kafka import Consumer, Producer

    p = Producer(rdkafka_conf(dict(conf, acks="all")))
    errors = []
    for v in values:
        p.produce(topic, v.encode(), on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert p.flush(30) == 0 and not errors, errors
    c = Consumer(rdkafka_conf(dict(conf, **{"group.id": f"g-{time.monotonic_ns()}",
                                            "auto.offset.reset": "earliest"})))
    c.subscribe([topic])
    seen = []
    deadline = time.monotonic() + 30
    while not set(values) <= set(seen) and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen.append(m.value().decode())
    c.close()
    assert set(values) <= set(seen), f"read back {seen}"


def auth_errors(conf, seconds=10):
    """The errors librdkafka reports while trying to connect with `conf`."""
    from confluent_kafka import Producer

    errors = []
    p = Producer(rdkafka_conf(dict(conf, error_cb=lambda e: errors.append(e))))
    deadline = time.monotonic() + seconds
    while not errors and time.monotonic() < deadline:
        p.poll(0.2)
    return errors


def test_scram_and_plain_over_sasl_ssl_with_three_clients(node):
    from kafka import KafkaConsumer, KafkaProducer

    rdkafka_roundtrip(sasl_conf(node, "SCRAM-SHA-512"), ["c-1", "c-2"])
    rdkafka_roundtrip(sasl_conf(node, "PLAIN"), ["c-3"])
    common = dict(bootstrap_servers=node.bootstrap("SECURE"), security_protocol="SASL_SSL",
                  sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
                  sasl_plain_password=PASSWORD, ssl_cafile=str(node.certs / "ca.pem"))
    kp = KafkaProducer(acks="all", **common)
    kp.send("ledger", b"k-1").get(timeout=30)
    kp.close()
    kc = KafkaConsumer("ledger", auto_offset_reset="earliest", consumer_timeout_ms=5000, **common)
    assert b"k-1" in [m.value for m in kc]
    kc.close()
    kcat = subprocess.run(
        [kcat_bin(), "-C", "-e", "-b", node.bootstrap("SECURE"), "-t", "ledger", "-f", "%s\n",
         "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-512",
         "-X", "sasl.username=alice", "-X", f"sasl.password={PASSWORD}",
         "-X", f"ssl.ca.location={node.certs / 'ca.pem'}"],
        capture_output=True, text=True, timeout=30)
    assert kcat.returncode == 0, kcat.stderr
    assert {"c-1", "c-2", "c-3", "k-1"} <= set(kcat.stdout.split())
    # Metadata on a listener names that listener's endpoints
    from confluent_kafka.admin import AdminClient

    md = AdminClient(rdkafka_conf(sasl_conf(node, "SCRAM-SHA-512"))).list_topics(timeout=10)
    assert [f"{b.host}:{b.port}" for b in md.brokers.values()] == [node.bootstrap("SECURE")]


def test_client_certificates_on_the_ssl_listener(node):
    from kafka import KafkaConsumer

    mtls = {"bootstrap.servers": node.bootstrap("MTLS"), "security.protocol": "SSL",
            "ssl.ca.location": str(node.certs / "ca.pem"),
            "ssl.certificate.location": str(node.certs / "client-alice.pem"),
            "ssl.key.location": str(node.certs / "client-alice.key")}
    rdkafka_roundtrip(mtls, ["m-1"])
    kc = KafkaConsumer("ledger", bootstrap_servers=node.bootstrap("MTLS"), security_protocol="SSL",
                       ssl_cafile=str(node.certs / "ca.pem"), ssl_certfile=str(node.certs / "client-alice.pem"),
                       ssl_keyfile=str(node.certs / "client-alice.key"),
                       auto_offset_reset="earliest", consumer_timeout_ms=5000)
    assert b"m-1" in [m.value for m in kc]
    kc.close()
    # without a client certificate the handshake fails
    no_cert = {k: v for k, v in mtls.items() if not k.startswith("ssl.certificate") and k != "ssl.key.location"}
    errors = auth_errors(no_cert)
    assert errors and any("certificate required" in str(e) or "SSL" in str(e) for e in errors), errors
    assert node.alive()


def test_wrong_credentials_and_wrong_protocols_fail_and_the_broker_keeps_serving(node):
    from confluent_kafka import KafkaError

    for conf in (sasl_conf(node, "SCRAM-SHA-512", password="wrong"),
                 sasl_conf(node, "SCRAM-SHA-256", user="mallory"),
                 sasl_conf(node, "PLAIN", password="wrong")):
        errors = auth_errors(conf)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
        assert "invalid user name or password" in str(errors[0]), errors
    # a plaintext client on the TLS port: the handshake fails, the client reports it
    errors = auth_errors({"bootstrap.servers": node.bootstrap("SECURE")}, seconds=5)
    assert errors, "a plaintext client on a SASL_SSL port connected"
    # a TLS client on the plaintext port
    errors = auth_errors({"bootstrap.servers": node.bootstrap("PLAIN"), "security.protocol": "SSL",
                          "ssl.ca.location": str(node.certs / "ca.pem")}, seconds=5)
    assert errors
    assert node.alive()
    assert "TLS handshake failed" in node.tail()
    rdkafka_roundtrip(sasl_conf(node, "SCRAM-SHA-512"), ["after-the-attacks"])


def tls_handshake(node, listener, **limits):
    """A Python (OpenSSL) TLS handshake with a listener: the negotiated (suite, version)."""
    ctx = ssl.create_default_context(cafile=str(node.certs / "ca.pem"))
    for name, value in limits.items():
        setattr(ctx, name, value)
    with socket.create_connection(("127.0.0.1", node.ports[listener]), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            suite, version, _ = tls.cipher()
            return suite, version


def test_cipher_suites_and_protocols_are_the_operators_choice(tmp_path):
    """Kafka's ssl.cipher.suites and ssl.enabled.protocols: the broker's order wins over the
    client's, a client that cannot meet them is refused, and names that are off are refused
    when the config is read."""
    tls_choice = 'cipher_suites = ["TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256"]\n' \
                 'protocols = ["TLSv1.3"]\n'
    n = SecureNode(tmp_path, tls_choice + "[auth]\nallow_everyone_if_no_acl_found = true\n")
    try:
        # OpenSSL's own order puts AES-256-GCM first; the broker's list decides
        assert tls_handshake(n, "SECURE") == ("TLS_AES_128_GCM_SHA256", "TLSv1.3")
        # a client that speaks TLS 1.2 at most is refused
        with pytest.raises(ssl.SSLError):
            tls_handshake(n, "SECURE", maximum_version=ssl.TLSVersion.TLSv1_2)
        assert n.alive()
        pw = tmp_path / "alice.pw"
        pw.write_text(PASSWORD + "\n")
        pw.chmod(0o600)
        n.user("create", "alice", "--password-file", str(pw))
        n.cli("topic", "create", "ledger", "--bootstrap", n.bootstrap("PLAIN"))
        rdkafka_roundtrip(sasl_conf(n, "SCRAM-SHA-512"), ["aes-128"])
    finally:
        n.stop()
    base = n.config.read_text().replace(tls_choice, "")
    for bad, says in (('cipher_suites = ["TLS_RSA_WITH_RC4_128_MD5"]\n', "unknown cipher suite"),
                      ('protocols = ["TLSv1.1"]\n', 'unknown protocol "TLSv1.1"'),
                      ('cipher_suites = ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]\nprotocols = ["TLSv1.3"]\n',
                       "no suite in cipher_suites works")):
        cfg = tmp_path / "bad.toml"
        cfg.write_text(base.replace("[auth]", bad + "[auth]"))
        r = subprocess.run([n.bin, "config", "check", str(cfg)], capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and says in r.stderr, r.stderr


def raw_request(sock, api_key, version, body=b""):
    header = struct.pack(">hhih", api_key, version, 7, 4) + b"test"
    sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
    head = sock.recv(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">i", head)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def test_only_apiversions_and_sasl_before_authentication(node):
    # SASL_PLAINTEXT: ApiVersions is answered, then a Metadata request closes the connection
    with socket.create_connection(("127.0.0.1", node.ports["SASL"]), timeout=5) as s:
        assert raw_request(s, 18, 0) is not None
        assert raw_request(s, 3, 1, struct.pack(">i", -1)) is None, "Metadata answered before SASL"
    # the same over TLS on the SASL_SSL port
    ctx = ssl.create_default_context(cafile=str(node.certs / "ca.pem"))
    with socket.create_connection(("127.0.0.1", node.ports["SECURE"]), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            assert raw_request(s, 18, 0) is not None
            assert raw_request(s, 0, 3, b"\xff\xff\x00\x01\x00\x00\x75\x30\x00\x00\x00\x00") is None
    # a large frame before authentication is not read (nor allocated): the connection closes
    with socket.create_connection(("127.0.0.1", node.ports["SASL"]), timeout=5) as s:
        s.sendall(struct.pack(">i", 50 << 20) + b"\x00" * 64)
        assert s.recv(4) == b"", "a 50 MiB frame was accepted before SASL"
    # an unsupported mechanism is refused with the offered ones
    with socket.create_connection(("127.0.0.1", node.ports["SASL"]), timeout=5) as s:
        resp = raw_request(s, 17, 1, struct.pack(">h", 6) + b"GSSAPI")
        assert resp is not None
        (error,) = struct.unpack(">h", resp[4:6])  # after the correlation id
        assert error == 33, resp  # UNSUPPORTED_SASL_MECHANISM
        assert b"SCRAM-SHA-512" in resp
    assert node.alive()


def sasl_plain_login(sock, user="alice", password=PASSWORD):
    """SaslHandshake v1 + SaslAuthenticate v1 with PLAIN; returns (error, session lifetime ms)."""
    mech = b"PLAIN"
    resp = raw_request(sock, 17, 1, struct.pack(">h", len(mech)) + mech)
    assert resp is not None and struct.unpack(">h", resp[4:6])[0] == 0, resp
    token = b"\0" + user.encode() + b"\0" + password.encode()
    resp = raw_request(sock, 36, 1, struct.pack(">i", len(token)) + token)
    if resp is None:
        return None, None
    (error, msg_len) = struct.unpack(">hh", resp[4:8])
    at = 8 + max(msg_len, 0)
    (auth_len,) = struct.unpack(">i", resp[at:at + 4])
    (lifetime,) = struct.unpack(">q", resp[at + 4 + auth_len:at + 12 + auth_len])
    return error, lifetime


def test_sessions_end_unless_reauthenticated_kip_368(tmp_path):
    """`connections_max_reauth = "2s"`: SaslAuthenticate v1 tells the client its session
    lifetime; a connection that does not re-authenticate is closed at its first request after
    it; one that re-authenticates goes on; librdkafka re-authenticates by itself."""
    n = node_with_alice(tmp_path, '[auth]\nallow_everyone_if_no_acl_found = true\n'
                                  '[kafka.sasl]\nconnections_max_reauth = "2s"\n')
    try:
        metadata = struct.pack(">i", -1)
        with socket.create_connection(("127.0.0.1", n.ports["SASL"]), timeout=5) as s:
            assert sasl_plain_login(s) == (0, 2000)
            assert raw_request(s, 3, 1, metadata) is not None
            time.sleep(2.3)
            assert raw_request(s, 3, 1, metadata) is None, "answered after the session ended"
        with socket.create_connection(("127.0.0.1", n.ports["SASL"]), timeout=5) as s:
            assert sasl_plain_login(s) == (0, 2000)
            time.sleep(1.2)
            assert sasl_plain_login(s) == (0, 2000), "re-authentication refused"
            time.sleep(1.2)  # 2.4 s after the first login, 1.2 s after the second
            assert raw_request(s, 3, 1, metadata) is not None, "closed although re-authenticated"
            # a wrong password on re-authentication ends the connection
            assert sasl_plain_login(s, password="wrong")[0] == 58
            assert raw_request(s, 3, 1, metadata) is None
        # librdkafka keeps producing across several session lifetimes
        from confluent_kafka import Producer

        errors, delivered = [], []
        p = Producer(rdkafka_conf(dict(sasl_conf(n, "SCRAM-SHA-512"), error_cb=lambda e: errors.append(e))))
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            p.produce("ledger", b"tick", on_delivery=lambda err, msg: delivered.append(err))
            p.poll(0.3)
        assert p.flush(30) == 0
        assert delivered and all(e is None for e in delivered), delivered
        assert not errors, errors
        log = (tmp_path / "strata.log").read_text(errors="replace")
        assert log.count("SASL re-authentication succeeded") >= 3, "librdkafka did not re-authenticate"
        assert n.alive()
    finally:
        n.stop()


def test_users_are_created_listed_and_deleted_without_exposing_keys(node, tmp_path):
    listed = node.user("list").stdout
    assert "alice\tSCRAM-SHA-256\titerations=8192" in listed
    assert "alice\tSCRAM-SHA-512\titerations=8192" in listed
    meta = node.cli("quorum", "metadata", "--controller", f"127.0.0.1:{node.controller}").stdout
    assert json.loads(meta)["scram_credentials"]["alice"]["SCRAM-SHA-512"] == "<redacted>"
    assert PASSWORD not in (tmp_path / "strata.log").read_text(errors="replace")
    # refused inputs, each with a one-line error
    r = node.user("create", "bob", "--password-env", "NO_SUCH_VARIABLE_SET", check=False)
    assert r.returncode != 0 and "NO_SUCH_VARIABLE_SET" in r.stderr
    r = node.user("create", "bob", "--password-file", str(tmp_path / "alice.pw"), "--iterations", "10", check=False)
    assert r.returncode != 0 and "iterations must be between 4096 and 16384" in r.stderr
    node.user("delete", "alice")
    assert "alice" not in node.user("list").stdout
    errors = auth_errors(sasl_conf(node, "SCRAM-SHA-512"))
    assert errors and "invalid user name or password" in str(errors[0])
    r = node.user("delete", "alice", check=False)
    assert r.returncode != 0 and "has no credentials" in r.stderr


def test_kafka_admin_clients_manage_scram_users_kip_554(node):
    """confluent-kafka's AdminClient creates, describes and deletes SCRAM users over the
    Kafka protocol (DescribeUserScramCredentials / AlterUserScramCredentials): the client
    sends only a salted password, and the user it made can log in."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialDeletion, UserScramCredentialUpsertion)

    admin = AdminClient({"bootstrap.servers": node.bootstrap("PLAIN")})
    done = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"carol-Pw")])
    done["carol"].result(30)
    rdkafka_roundtrip(sasl_conf(node, "SCRAM-SHA-512", password="carol-Pw", user="carol"), ["by carol"])

    every = admin.describe_user_scram_credentials().result(30)
    assert sorted(every) == ["alice", "carol"]
    carol = [(i.mechanism, i.iterations) for i in every["carol"].scram_credential_infos]
    assert carol == [(ScramMechanism.SCRAM_SHA_512, 8192)]
    assert len(every["alice"].scram_credential_infos) == 2
    with pytest.raises(KafkaException) as e:
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(30)
    assert e.value.args[0].name() == "RESOURCE_NOT_FOUND"
    # Too few iterations is refused, and changes nothing.
    weak = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"dave-Pw")])
    with pytest.raises(KafkaException) as e:
        weak["dave"].result(30)
    assert e.value.args[0].name() == "UNACCEPTABLE_CREDENTIAL"
    assert "dave" not in admin.describe_user_scram_credentials().result(30)

    gone = admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)])
    gone["carol"].result(30)
    errors = auth_errors(sasl_conf(node, "SCRAM-SHA-512", password="carol-Pw", user="carol"))
    assert errors and "invalid user name or password" in str(errors[0])
    assert node.alive()


def test_the_principal_is_the_sasl_user_or_the_certificate_subject(node):
    """Admin requests are logged with who sent them (authorization by these principals is
    the next part of issue 15)."""
    from confluent_kafka.admin import AdminClient

    for name in ("scratch-1", "scratch-2"):
        node.cli("topic", "create", name, "--bootstrap", node.bootstrap("PLAIN"))
    mtls = {"bootstrap.servers": node.bootstrap("MTLS"), "security.protocol": "SSL",
            "ssl.ca.location": str(node.certs / "ca.pem"),
            "ssl.certificate.location": str(node.certs / "client-alice.pem"),
            "ssl.key.location": str(node.certs / "client-alice.key")}
    for conf, topic, principal in ((mtls, "scratch-1", "User:CN=alice"),
                                   (sasl_conf(node, "SCRAM-SHA-512"), "scratch-2", "User:alice"),
                                   ):
        admin = AdminClient(rdkafka_conf(conf))
        admin.delete_topics([topic], operation_timeout=10)[topic].result(timeout=30)
        deadline = time.monotonic() + 5
        while f"principal={principal} " not in node.tail() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"principal={principal} " in node.tail(), node.tail()[-1500:]


def test_grpc_produce_into_the_offsets_topic_is_refused(node):
    """The attack of issue 15: a forged commit written through the gRPC data plane into
    `__consumer_offsets` moved every group's offset. Every produce path now refuses internal
    topics in the broker's append; the group's committed offset is unchanged."""
    from confluent_kafka import Consumer, TopicPartition

    rdkafka_roundtrip({"bootstrap.servers": node.bootstrap("PLAIN")}, ["v-1", "v-2"])
    conf = {"bootstrap.servers": node.bootstrap("PLAIN"), "group.id": "victims",
            "auto.offset.reset": "earliest", "enable.auto.commit": False}
    c = Consumer(rdkafka_conf(conf))
    c.subscribe(["ledger"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            c.commit(message=m, asynchronous=False)
            break
    committed = c.committed([TopicPartition("ledger", 0)], timeout=10)[0].offset
    c.close()
    assert committed == 1
    attack = subprocess.run([node.bin, "produce", "--grpc", f"127.0.0.1:{node.grpc}", "-t", "__consumer_offsets"],
                            input="forged\n", capture_output=True, text=True, timeout=30)
    assert attack.returncode != 0, attack.stdout
    assert "cannot append to internal topic __consumer_offsets" in attack.stderr, attack.stderr
    c = Consumer(rdkafka_conf(conf))
    assert c.committed([TopicPartition("ledger", 0)], timeout=10)[0].offset == committed
    c.close()
    assert node.alive()


def test_strata_dev_secure_starts_locked_down_and_says_how_to_connect(tmp_path):
    """`strata dev --secure`: SASL_SSL with SCRAM on the Kafka port, mTLS on the gRPC ports,
    ACLs closed by default; the admin's password and certificates are made under the data
    directory and the start-up message says how to connect."""
    from confluent_kafka import Producer

    binary = strata_bin()
    kafka, controller, grpc_port = free_port(), free_port(), free_port()
    data = tmp_path / "data"
    out = open(tmp_path / "dev.log", "ab")
    proc = subprocess.Popen(
        [binary, "dev", "--secure", "--data-dir", str(data), "--listen", f"127.0.0.1:{kafka}",
         "--controller-listen", f"127.0.0.1:{controller}", "--grpc", f"127.0.0.1:{grpc_port}"],
        stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=dict(os.environ, NO_COLOR="1"))
    certs = data / "certs"
    admin_tls = dict(os.environ, RUST_BACKTRACE="0", STRATA_TLS_CA=str(certs / "ca.pem"),
                     STRATA_TLS_CERT=str(certs / "client-admin.pem"), STRATA_TLS_KEY=str(certs / "client-admin.key"))
    log = lambda: (tmp_path / "dev.log").read_text(errors="replace")[-4000:]

    def cli(*args, env=admin_tls):
        return subprocess.run([binary, *args, "--controller", f"127.0.0.1:{controller}"],
                              capture_output=True, text=True, timeout=30, env=env)

    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log()
            assert time.monotonic() < deadline, "never ready:\n" + log()
            r = cli("quorum", "metadata") if port_accepts(controller) else None
            if r is not None and r.returncode == 0:
                m = json.loads(r.stdout)
                if "admin" in m["scram_credentials"] and any(not b["fenced"] for b in m["brokers"].values()):
                    break
            time.sleep(0.2)
        password_file = data / "admin.password"
        assert password_file.stat().st_mode & 0o077 == 0, "the admin password is readable by others"
        password = password_file.read_text().strip()
        assert "SASL_SSL" in log() and str(password_file) in log() and password not in log()

        # Without the admin's certificate the controller is out of reach.
        plain = cli("quorum", "describe", env=dict(os.environ, RUST_BACKTRACE="0"))
        assert plain.returncode != 0, plain.stdout
        assert cli("topic", "create", "orders", "-p", "1").returncode == 0

        conf = {"bootstrap.servers": f"127.0.0.1:{kafka}", "security.protocol": "SASL_SSL",
                "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "admin", "sasl.password": password,
                "ssl.ca.location": str(certs / "ca.pem")}
        rdkafka_roundtrip(conf, ["settled 1", "settled 2"], topic="orders")

        # Another user authenticates but may do nothing no ACL allows.
        bob_pw = tmp_path / "bob.pw"
        bob_pw.write_text("bob-password\n")
        bob_pw.chmod(0o600)
        assert cli("user", "create", "bob", "--password-file", str(bob_pw)).returncode == 0
        errors = []
        p = Producer(rdkafka_conf(dict(conf, **{"sasl.username": "bob", "sasl.password": "bob-password",
                                                "message.timeout.ms": 10000})))
        p.produce("orders", b"not bob's", on_delivery=lambda err, msg: errors.append(err))
        p.flush(20)
        assert len(errors) == 1 and errors[0] is not None and errors[0].name() == "TOPIC_AUTHORIZATION_FAILED", errors
        assert proc.poll() is None
    finally:
        stop_process(proc)
        out.close()


def test_metrics_over_https_with_basic_auth(tmp_path):
    """`[metrics]` on its own address behind TLS and HTTP basic auth: a scrape without the
    password, with a wrong one, or over plain HTTP gets nothing; the metrics hold no secret."""
    import base64
    import urllib.error
    import urllib.request

    port = free_port()
    pw = tmp_path / "metrics.pw"
    pw.write_text("scrape-Pw\n")
    pw.chmod(0o600)
    n = SecureNode(tmp_path, f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
                             f'[metrics.tls]\ncert = "{tmp_path}/certs/node-broker.pem"\nkey = "{tmp_path}/certs/node-broker.key"\n'
                             f'[metrics.basic_auth]\nuser = "prometheus"\npassword_file = "{pw}"\n')
    try:
        ctx = ssl.create_default_context(cafile=str(n.certs / "ca.pem"))
        url = f"https://127.0.0.1:{port}/metrics"

        def scrape(password=None):
            req = urllib.request.Request(url)
            if password is not None:
                token = base64.b64encode(f"prometheus:{password}".encode()).decode()
                req.add_header("Authorization", f"Basic {token}")
            return urllib.request.urlopen(req, timeout=10, context=ctx)

        for password in (None, "wrong"):
            with pytest.raises(urllib.error.HTTPError) as e:
                scrape(password)
            assert e.value.code == 401
        with pytest.raises(Exception):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
        text = scrape("scrape-Pw").read().decode()
        assert "strata_produce_requests_total" in text
        assert "scrape-Pw" not in text and PASSWORD not in text
        assert n.alive()
    finally:
        n.stop()


def test_oauthbearer_tokens_checked_against_a_jwks(tmp_path):
    """SASL/OAUTHBEARER: tokens signed by the identity provider's key (RS256, from a JWKS
    file) with the right issuer and audience log in as their `sub`, with confluent-kafka and
    kafka-python; an expired token, one signed by another key and one for another audience
    fail with the client's authentication error, and the broker keeps serving."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa
    from kafka import KafkaProducer
    from kafka.net.sasl.oauth import AbstractTokenProvider

    idp = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(idp.public_key()))
    jwk.update(kid="idp-1", use="sig")
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    n = SecureNode(tmp_path, '[auth]\nallow_everyone_if_no_acl_found = true\n'
                             '[kafka.sasl]\nmechanisms = ["OAUTHBEARER", "SCRAM-SHA-512"]\n'
                             'connections_max_reauth = "1h"\n'
                             f'[kafka.sasl.oauthbearer]\njwks = "{tmp_path / "jwks.json"}"\n'
                             'issuer = "https://idp.example"\naudience = "strata"\n')

    def token(exp_in=300, key=idp, aud="strata", sub="order-service", drop=()):
        now = int(time.time())
        claims = {"sub": sub, "iss": "https://idp.example", "aud": aud, "iat": now, "exp": now + exp_in}
        claims = {k: v for k, v in claims.items() if k not in drop}
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "idp-1"})

    def conf(make):
        return {"bootstrap.servers": n.bootstrap("SECURE"), "security.protocol": "SASL_SSL",
                "sasl.mechanisms": "OAUTHBEARER", "ssl.ca.location": str(n.certs / "ca.pem"),
                "oauth_cb": lambda _config: (make(), time.time() + 300)}

    try:
        n.cli("topic", "create", "ledger", "--bootstrap", n.bootstrap("PLAIN"))
        rdkafka_roundtrip(conf(token), ["o-1", "o-2"])

        class Provider(AbstractTokenProvider):
            def token(self):
                return token(sub="analyst")

        kp = KafkaProducer(bootstrap_servers=n.bootstrap("SECURE"), security_protocol="SASL_SSL",
                           sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=Provider(),
                           ssl_cafile=str(n.certs / "ca.pem"), acks="all")
        kp.send("ledger", b"o-3").get(timeout=30)
        kp.close()
        log = (tmp_path / "strata.log").read_text(errors="replace")

        # issue 47: a token the same provider signed for another service, without `iss` or
        # without `aud`, logged in although both are configured
        for what, bad in (("expired", lambda: token(exp_in=-120)), ("another key", lambda: token(key=stranger)),
                          ("another audience", lambda: token(aud="other")),
                          ("no iss", lambda: token(drop=("iss",))), ("no aud", lambda: token(drop=("aud",)))):
            errors = auth_errors(conf(bad))
            assert errors and errors[0].name() == "_AUTHENTICATION", (what, errors)
        assert n.alive()
        log = (tmp_path / "strata.log").read_text(errors="replace")
        assert "invalid token" in log and "ExpiredSignature" in log, log[-3000:]
    finally:
        n.stop()


def test_the_native_grpc_client_with_a_bearer_token(tmp_path, pb):
    """The gRPC data plane takes `authorization: Bearer <jwt>` from the identity provider
    the brokers trust for OAUTHBEARER: the token's subject is the principal, held to the
    Kafka ACLs; `strata produce --token-file` sends it."""
    import grpc
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    idp = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(idp.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    # SASL listeners authenticate: resources without ACLs are closed.
    n = SecureNode(tmp_path, '[kafka.sasl]\nmechanisms = ["OAUTHBEARER", "SCRAM-SHA-512"]\n'
                             f'[kafka.sasl.oauthbearer]\njwks = "{tmp_path / "jwks.json"}"\n'
                             'issuer = "https://idp.example"\naudience = "strata"\n')

    def token(sub, key=idp, drop=()):
        now = int(time.time())
        claims = {"sub": sub, "iss": "https://idp.example", "aud": "strata", "exp": now + 300}
        return jwt.encode({k: v for k, v in claims.items() if k not in drop}, key, algorithm="RS256")

    def token_file(name, value):
        path = tmp_path / f"{name}.token"
        path.write_text(value + "\n")
        path.chmod(0o600)
        return str(path)

    try:
        controller = f"127.0.0.1:{n.controller}"
        n.cli("topic", "create", "ledger", "--controller", controller)
        n.cli("acl", "add", "--controller", controller, "--allow-principal", "User:order-service",
              "--operation", "Write", "--operation", "Describe", "--topic", "ledger")
        grpc_addr = f"127.0.0.1:{n.grpc}"

        def produce(path):
            return subprocess.run([n.bin, "produce", "--grpc", grpc_addr, "-t", "ledger", "--token-file", path],
                                  input=b"nav 101.7\n", capture_output=True, timeout=60,
                                  env=dict(os.environ, RUST_BACKTRACE="0"))

        ok = produce(token_file("order", token("order-service")))
        assert ok.returncode == 0, ok.stderr
        denied = produce(token_file("mallory", token("mallory")))
        assert denied.returncode != 0 and b"CLUSTER_AUTHORIZATION_FAILED" in denied.stderr, denied.stderr

        stub = pb.broker_pb2_grpc.BrokerStub(grpc.insecure_channel(grpc_addr))
        produce_req = pb.broker_pb2.ProduceRequest(topic="ledger", partition=0, acks=-1, timeout_ms=5000, records=b"")

        def call(rpc, req, bearer):
            md = [("authorization", f"Bearer {bearer}")] if bearer else []
            return rpc(req, timeout=5, metadata=md)

        for bearer, code in ((token("mallory"), grpc.StatusCode.PERMISSION_DENIED),
                             (None, grpc.StatusCode.PERMISSION_DENIED),
                             (token("order-service", key=stranger), grpc.StatusCode.UNAUTHENTICATED),
                             (token("order-service", drop=("iss",)), grpc.StatusCode.UNAUTHENTICATED),
                             (token("order-service", drop=("aud",)), grpc.StatusCode.UNAUTHENTICATED),
                             ("not-a-jwt", grpc.StatusCode.UNAUTHENTICATED)):
            with pytest.raises(grpc.RpcError) as e:
                call(stub.Produce, produce_req, bearer)
            assert e.value.code() == code, (bearer, e.value.details())
        end = call(stub.ListOffsets, pb.broker_pb2.ListOffsetsRequest(topic="ledger", partition=0, timestamp=-1),
                   token("order-service"))
        assert end.offset == 1, "exactly the order service's record is in the log"
    finally:
        n.stop()
