#!/usr/bin/env python3
"""A mock OAuth 2.0 / OIDC identity provider for librdkafka's 0126_oauthbearer_oidc, the part
trivup's OauthbearerOIDCApp plays in librdkafka's own CI (trivup 0.12.2, the latest on PyPI,
serves client_credentials only; the jwt-bearer and Azure IMDS behaviour here follows
librdkafka 2.12's OIDC client, rdkafka_sasl_oauthbearer_oidc.c, and what the test expects).
Run by run_suite.py with the shim python (it needs PyJWT and cryptography,
tests/requirements.txt).

  oidc_idp.py keys DIR PASSWORD
      The provider's signing key and its JWKS (jwks.json, what the Strata nodes trust), and
      the client's RSA key for the jwt-bearer grant: plain (client.key), encrypted with
      PASSWORD (client-encrypted.key) and its public half (client.pub). Prints a JSON object
      with the file names.
  oidc_idp.py serve DIR
      Serves the token endpoints on 127.0.0.1 (an ephemeral port) with the keys in DIR;
      prints "listening on http://127.0.0.1:PORT" once it accepts, then a line per request.

The endpoints (paths are constants below, the URLs of the test's environment):
  POST /token          grant_type=client_credentials (HTTP Basic CLIENT_ID:CLIENT_SECRET) or
                       urn:ietf:params:oauth:grant-type:jwt-bearer (an assertion signed RS256
                       by the client's key, with a sub); an optional scope of VALID_SCOPES.
                       Answers an RS256 token for ISSUER and AUDIENCE whose sub is the client
                       id or the assertion's sub, living TOKEN_LIFETIME_S.
  POST /token/expired  the same checks; the token expired an hour ago, beyond any broker's
                       clock skew.
  POST /token/forged   the same checks; the token carries the trusted kid but is signed by a
                       key the JWKS does not hold.
  GET  /token?__metadata_authentication_type=azure_imds&api-version=..&resource=..&client_id=..
                       Azure IMDS managed identity, as librdkafka's azure_imds metadata
                       authentication calls it: a `Metadata: true` header and all three
                       parameters are required (the mock has no system-assigned identity, so
                       no client_id is an error, as 0126 expects). Answers IMDS's JSON
                       (numbers as strings), the token's sub the client_id.
Errors are RFC 6749 section 5.2 JSON, status 400 (401 for a client that does not
authenticate); librdkafka gives up at once on either (only 408, 425, 429 and 5xx are retried).
"""

import base64
import hmac
import json
import os
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

# What the brokers are configured to expect ([kafka.sasl.oauthbearer]) and what test.conf
# sends (run_suite.py reads these).
ISSUER = "strata-librdkafka-suite-idp"
AUDIENCE = "strata"
KID = "suite-idp-1"
CLIENT_ID, CLIENT_SECRET = "librdkafka-suite-client", "suite-client-secret"
# trivup's: test.conf asks for "test"; 0126's "invalid scope" variant asks for invalid_scope
VALID_SCOPES = {"test", "test-scope", "api://1234-abcd/.default"}
# trivup's tokens live 4 s: 0126 waits 5 s before consuming so that librdkafka fetches a new
# token (at 80 % of the lifetime) and logs in again with it (KIP-368) while it runs
TOKEN_LIFETIME_S = 4
PATHS = {"/token": "valid", "/token/expired": "expired", "/token/forged": "forged"}
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"


def keys(out: Path, password: str):
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    out.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8

    def write(name, data, mode=0o600):
        p = out / name
        p.write_bytes(data)
        os.chmod(p, mode)
        return str(p)

    signer = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    client = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signer.public_key()))
    jwk.update(kid=KID, use="sig", alg="RS256")
    files = {
        "signing_key": write("idp-signing.key", signer.private_bytes(
            pem, pkcs8, serialization.NoEncryption())),
        "jwks": write("jwks.json", json.dumps({"keys": [jwk]}).encode(), 0o644),
        "client_key": write("client.key", client.private_bytes(
            pem, pkcs8, serialization.NoEncryption())),
        "client_key_encrypted": write("client-encrypted.key", client.private_bytes(
            pem, pkcs8, serialization.BestAvailableEncryption(password.encode()))),
        "client_pub": write("client.pub", client.public_key().public_bytes(
            pem, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644),
    }
    print(json.dumps({"files": files}))


class Refused(Exception):
    """An RFC 6749 error answer: status, error code, description."""

    def __init__(self, status, error, description):
        super().__init__(description)
        self.status, self.error, self.description = status, error, description


class IdP:
    """The keys and the token rules, without HTTP."""

    def __init__(self, d: Path):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        self.signer = serialization.load_pem_private_key(
            (d / "idp-signing.key").read_bytes(), None)
        self.client_pub = serialization.load_pem_public_key((d / "client.pub").read_bytes())
        # signs /token/forged's tokens: not in jwks.json
        self.stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def token(self, kind, sub, scope=None):
        import jwt

        now = int(time.time())
        exp = now - 3600 if kind == "expired" else now + TOKEN_LIFETIME_S
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": min(now, exp),
                  "exp": exp, "jti": str(uuid.uuid4())}
        if scope:
            claims["scope"] = scope
        key = self.stranger if kind == "forged" else self.signer
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": KID}), exp

    @staticmethod
    def check_scope(scope):
        if scope is not None and not set(scope.split()) <= VALID_SCOPES:
            raise Refused(400, "invalid_scope",
                          f"scope {scope!r} is not one of {sorted(VALID_SCOPES)}")

    @staticmethod
    def client_credentials(authorization):
        """The client id from an HTTP Basic authorization of CLIENT_ID:CLIENT_SECRET."""
        if not authorization or not authorization.startswith("Basic "):
            raise Refused(401, "invalid_client", "HTTP Basic client authentication is required")
        try:
            cid, _, secret = base64.b64decode(authorization[6:], validate=True).decode() \
                .partition(":")
        except ValueError:
            raise Refused(401, "invalid_client", "the Basic credentials are not base64 id:secret")
        if not (hmac.compare_digest(cid, CLIENT_ID) and hmac.compare_digest(secret, CLIENT_SECRET)):
            raise Refused(401, "invalid_client", f"unknown client {cid!r} or a wrong secret")
        return cid

    def jwt_bearer(self, assertion):
        """The subject of an assertion (RFC 7523) signed by the client's key."""
        import jwt

        if not assertion:
            raise Refused(400, "invalid_request", "no assertion")
        try:
            alg = jwt.get_unverified_header(assertion).get("alg")
        except jwt.PyJWTError as e:
            raise Refused(400, "invalid_grant", f"the assertion is not a JWT: {e}")
        if alg != "RS256":
            # 0126's "JOSE algorithm ES256" variant: its header says ES256, the key is RSA
            raise Refused(400, "invalid_grant",
                          f"the assertion's header says alg {alg}; the client's registered key "
                          "is RSA (RS256)")
        try:
            claims = jwt.decode(assertion, self.client_pub, algorithms=["RS256"], leeway=30,
                                options={"require": ["exp", "sub"], "verify_aud": False})
        except jwt.PyJWTError as e:
            raise Refused(400, "invalid_grant", f"the assertion does not verify: {e}")
        return claims["sub"]

    @staticmethod
    def azure_imds(query, headers):
        """The client id of an IMDS managed-identity request, or why it is refused."""
        if headers.get("Metadata", "").lower() != "true":
            raise Refused(400, "invalid_request", "Required metadata header not specified")
        for name in ("api-version", "resource", "client_id"):
            if not query.get(name):
                raise Refused(400, "invalid_request", f"Required parameter {name} not specified")
        return query["client_id"]


def single(values):
    """{name: value} from parse_qs's {name: [values]}; a repeated parameter is an error."""
    out = {}
    for k, v in values.items():
        if len(v) != 1:
            raise Refused(400, "invalid_request", f"parameter {k} appears {len(v)} times")
        out[k] = v[0]
    return out


class Handler(BaseHTTPRequestHandler):
    server_version = "strata-suite-idp"

    def log_message(self, fmt, *args):  # one line per request is written by answer()
        pass

    def answer(self, status, body, note):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)
        print(f"{time.strftime('%H:%M:%S')} {self.command} {self.path[:160]} -> {status} {note}",
              flush=True)

    def refuse(self, r: Refused):
        self.answer(r.status, {"error": r.error, "error_description": r.description},
                    f"{r.error}: {r.description}")

    def do_POST(self):
        idp = self.server.idp
        try:
            kind = PATHS.get(urlsplit(self.path).path)
            if kind is None:
                raise Refused(404, "invalid_request", f"no token endpoint at {self.path}")
            ctype = self.headers.get("Content-Type", "")
            if not ctype.startswith("application/x-www-form-urlencoded"):
                raise Refused(400, "invalid_request",
                              "the body must be application/x-www-form-urlencoded")
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode()
            except ValueError:
                raise Refused(400, "invalid_request", "no readable form body")
            form = single(parse_qs(body, keep_blank_values=True))
            grant = form.get("grant_type")
            if grant == "client_credentials":
                sub = idp.client_credentials(self.headers.get("Authorization"))
            elif grant == JWT_BEARER:
                sub = idp.jwt_bearer(form.get("assertion"))
            else:
                raise Refused(400, "unsupported_grant_type", f"grant_type {grant!r}")
            idp.check_scope(form.get("scope"))
            token, exp = idp.token(kind, sub, form.get("scope"))
        except Refused as r:
            return self.refuse(r)
        self.answer(200, {"access_token": token, "token_type": "Bearer",
                          "expires_in": exp - int(time.time()),
                          **({"scope": form["scope"]} if form.get("scope") else {})},
                    f"{kind} token for {sub} ({grant})")

    def do_GET(self):
        idp = self.server.idp
        url = urlsplit(self.path)
        try:
            query = single(parse_qs(url.query, keep_blank_values=True))
            if url.path != "/token" or query.get("__metadata_authentication_type") != "azure_imds":
                raise Refused(404, "invalid_request", f"nothing to GET at {self.path}")
            sub = idp.azure_imds(query, self.headers)
            token, exp = idp.token("valid", sub)
        except Refused as r:
            return self.refuse(r)
        now = int(time.time())
        self.answer(200, {"access_token": token, "refresh_token": "",
                          "expires_in": str(exp - now), "expires_on": str(exp),
                          "ext_expires_in": str(exp - now), "not_before": str(now),
                          "resource": query["resource"], "token_type": "Bearer",
                          "client_id": sub},
                    f"IMDS token for {sub}")


def serve(d: Path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.idp = IdP(d)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "keys":
        keys(Path(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(Path(sys.argv[2]))
    else:
        sys.exit(__doc__)
