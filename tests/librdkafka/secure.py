#!/usr/bin/env python3
"""Fixtures for librdkafka's security tests (suite_sets.SECURE), run by run_suite.py with the
shim python (it needs `cryptography` and `confluent_kafka`).

  secure.py certs DIR PASSWORD
      A CA, a server certificate for 127.0.0.1/localhost and a client certificate signed by
      it, in every form 0097_ssl_verify reads (what trivup makes for Kafka). Prints a JSON
      object: the SSL_* environment variables for the test runner (SSL_client_auth is the
      profile's), and the file names.
  secure.py user BOOTSTRAP SASL_SSL_BOOTSTRAP CA USER PASSWORD
      Creates USER with both SCRAM mechanisms through BOOTSTRAP (a PLAINTEXT listener that
      lets everyone alter the cluster), then waits until USER logs in on the SASL_SSL listener
      with SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN.
"""

import datetime
import ipaddress
import json
import os
import sys
import time
from pathlib import Path


def certs(out: Path, password: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)

    def key():
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Strata librdkafka suite"),
                          x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def ca(cn):
        k = key()
        c = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn))
             .public_key(k.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(start).not_valid_after(end)
             .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
             .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                          crl_sign=True, content_commitment=False,
                                          key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False,
                                          decipher_only=False), critical=True)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(k.public_key()),
                            critical=False)
             .sign(k, hashes.SHA256()))
        return k, c

    def leaf(cn, ca_key, ca_cert, server):
        k = key()
        b = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca_cert.subject)
             .public_key(k.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(start).not_valid_after(end)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True,
                                          key_cert_sign=False, crl_sign=False,
                                          content_commitment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False,
                                          decipher_only=False), critical=True)
             .add_extension(x509.ExtendedKeyUsage(
                 [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                 critical=False)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(k.public_key()),
                            critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                 ca_key.public_key()), critical=False))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        return k, b.sign(ca_key, hashes.SHA256())

    pem, der = serialization.Encoding.PEM, serialization.Encoding.DER
    pkcs8 = serialization.PrivateFormat.PKCS8
    plain = serialization.NoEncryption()
    locked = serialization.BestAvailableEncryption(password.encode())

    def write(fname, data, mode=0o644):
        p = out / fname
        p.write_bytes(data)
        os.chmod(p, mode)
        return str(p)

    ca_key, ca_cert = ca("librdkafka-suite CA")
    # a second, unrelated CA: SSL_all_cas_pem "contains multiple CA certs"
    _, other_ca = ca("librdkafka-suite other CA")
    srv_key, srv_cert = leaf("127.0.0.1", ca_key, ca_cert, server=True)
    cli_key, cli_cert = leaf("librdkafka-suite-client", ca_key, ca_cert, server=False)

    files = {
        "ca": write("ca.pem", ca_cert.public_bytes(pem)),
        "ca_der": write("ca.der", ca_cert.public_bytes(der)),
        "all_cas": write("all-cas.pem", ca_cert.public_bytes(pem) + other_ca.public_bytes(pem)),
        "server_cert": write("server.pem", srv_cert.public_bytes(pem) + ca_cert.public_bytes(pem)),
        # Strata refuses a key others may read
        "server_key": write("server.key", srv_key.private_bytes(pem, pkcs8, plain), 0o600),
        "client_cert": write("client.pem", cli_cert.public_bytes(pem)),
        "client_cert_der": write("client.der", cli_cert.public_bytes(der)),
        # ssl.key.location: encrypted, opened with ssl.key.password (as trivup's)
        "client_key": write("client.key", cli_key.private_bytes(pem, pkcs8, locked), 0o600),
        # DER keys are read without a password (d2i_PrivateKey_bio): plain
        "client_key_der": write("client.key.der", cli_key.private_bytes(der, pkcs8, plain), 0o600),
        # key, certificate and CA, opened with ssl.key.password (PKCS12_parse)
        "client_p12": write("client.p12", pkcs12.serialize_key_and_certificates(
            b"librdkafka-suite-client", cli_key, cli_cert, [ca_cert], locked), 0o600),
    }
    env = {
        "SSL_pkcs": files["client_p12"],
        "SSL_pub_der": files["client_cert_der"],
        "SSL_pub_pem": files["client_cert"],
        "SSL_priv_der": files["client_key_der"],
        "SSL_priv_pem": files["client_key"],
        "SSL_ca_der": files["ca_der"],
        "SSL_all_cas_pem": files["all_cas"],
        "SSL_password": password,
    }
    print(json.dumps({"env": env, "files": files}))


def user(bootstrap, sasl_bootstrap, ca, name, password):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialUpsertion)

    admin = AdminClient({"bootstrap.servers": bootstrap})
    ups = [UserScramCredentialUpsertion(name, ScramCredentialInfo(m, 8192), password.encode())
           for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)]
    for user_name, fut in admin.alter_user_scram_credentials(ups).items():
        fut.result(30)
    last = None
    deadline = time.monotonic() + 30
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
        while True:
            c = AdminClient({"bootstrap.servers": sasl_bootstrap, "security.protocol": "SASL_SSL",
                             "sasl.mechanism": mech, "sasl.username": name,
                             "sasl.password": password, "ssl.ca.location": ca})
            try:
                c.list_topics(timeout=5)
                break
            except KafkaException as e:
                last = e
                if time.monotonic() > deadline:
                    sys.exit(f"user {name} cannot log in with {mech} on {sasl_bootstrap}: {last}")
                time.sleep(0.5)
    print(f"user {name}: SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN logins work on {sasl_bootstrap}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "certs":
        certs(Path(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 7 and sys.argv[1] == "user":
        user(*sys.argv[2:])
    else:
        sys.exit(__doc__)
