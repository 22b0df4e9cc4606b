//! SASL/OAUTHBEARER (RFC 7628, Kafka's KIP-255): the client sends a JWT, which is accepted
//! when it is signed by a key of the configured JWKS file and its issuer, audience and
//! expiry hold. The principal is `User:` and a configured claim (`sub` by default).
//!
//! Only asymmetric keys (RSA, EC, Ed25519) are trusted, and each only for the algorithms of
//! its kind, so a token cannot pick a weaker check (`alg: none`, HMAC with the public key).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

/// `[kafka.sasl.oauthbearer]`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthSection {
    /// The identity provider's public keys, a JWKS document (`{"keys": [...]}`); read at
    /// start.
    pub jwks: PathBuf,
    /// The `iss` a token must carry (Kafka's `sasl.oauthbearer.expected.issuer`).
    pub issuer: Option<String>,
    /// An `aud` a token must carry (Kafka's `sasl.oauthbearer.expected.audience`).
    pub audience: Option<String>,
    /// The claim that names the principal (Kafka's `sasl.oauthbearer.sub.claim.name`).
    #[serde(default = "default_claim")]
    pub principal_claim: String,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(
        default = "default_skew",
        deserialize_with = "crate::config::duration",
        serialize_with = "crate::config::show_duration"
    )]
    pub clock_skew: Duration,
}

fn default_claim() -> String {
    "sub".into()
}

fn default_skew() -> Duration {
    Duration::from_secs(30)
}

struct Key {
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

/// Checks tokens against the JWKS and the expected claims.
pub struct Validator {
    keys: Vec<Key>,
    issuer: Option<String>,
    audience: Option<String>,
    principal_claim: String,
    skew: Duration,
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validator")
            .field("keys", &self.keys.len())
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish()
    }
}

/// The algorithms a key may verify: what its JWK names, else every one of its kind.
fn algorithms(
    params: &AlgorithmParameters,
    named: Option<Algorithm>,
) -> anyhow::Result<Vec<Algorithm>> {
    use Algorithm::*;
    let of_kind = match params {
        AlgorithmParameters::RSA(_) => vec![RS256, RS384, RS512, PS256, PS384, PS512],
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => vec![ES256],
            EllipticCurve::P384 => vec![ES384],
            ref other => bail!("EC curve {other:?} is not supported (P-256, P-384)"),
        },
        AlgorithmParameters::OctetKeyPair(_) => vec![EdDSA],
        AlgorithmParameters::OctetKey(_) => {
            bail!("a symmetric key (kty \"oct\") has no place in a JWKS of public keys")
        }
        _ => bail!("unsupported key type"),
    };
    Ok(match named {
        Some(alg) if of_kind.contains(&alg) => vec![alg],
        Some(alg) => bail!("alg {alg:?} does not fit the key's type"),
        None => of_kind,
    })
}

impl Validator {
    pub fn load(section: &OAuthSection) -> anyhow::Result<Validator> {
        let path = &section.jwks;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the JWKS {}", path.display()))?;
        let set: JwkSet = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JWKS document", path.display()))?;
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let what = || format!("key {i} ({:?}) of {}", jwk.common.key_id, path.display());
            let named = jwk
                .common
                .key_algorithm
                .map(Algorithm::try_from)
                .transpose()
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(what)?;
            keys.push(Key {
                kid: jwk.common.key_id.clone(),
                key: DecodingKey::from_jwk(jwk).with_context(what)?,
                algorithms: algorithms(&jwk.algorithm, named).with_context(what)?,
            });
        }
        if keys.is_empty() {
            bail!("{} holds no key", path.display());
        }
        if section.principal_claim.is_empty() {
            bail!("kafka.sasl.oauthbearer.principal_claim is empty");
        }
        Ok(Validator {
            keys,
            issuer: section.issuer.clone(),
            audience: section.audience.clone(),
            principal_claim: section.principal_claim.clone(),
            skew: section.clock_skew,
        })
    }

    /// The token's principal name and expiry (seconds since the epoch), or why it is refused.
    pub fn validate(&self, token: &str) -> Result<(String, u64), String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| format!("not a JWT: {e}"))?;
        let candidates: Vec<&Key> = match &header.kid {
            Some(kid) => self
                .keys
                .iter()
                .filter(|k| k.kid.as_deref() == Some(kid))
                .collect(),
            None => self.keys.iter().collect(),
        };
        if candidates.is_empty() {
            return Err(format!("no key with kid {:?} in the JWKS", header.kid));
        }
        let mut last = String::from("no key fits the token's algorithm");
        for k in candidates {
            if !k.algorithms.contains(&header.alg) {
                continue;
            }
            let mut v = Validation::new(header.alg);
            v.algorithms = k.algorithms.clone();
            v.leeway = self.skew.as_secs();
            // A configured issuer or audience is required, not only checked when present:
            // jsonwebtoken skips a claim the token leaves out unless it is listed here, and
            // a token the same provider signed for another service often has no `aud`.
            let mut required = vec!["exp"];
            required.extend(self.issuer.is_some().then_some("iss"));
            required.extend(self.audience.is_some().then_some("aud"));
            v.set_required_spec_claims(&required);
            v.validate_nbf = true;
            match &self.issuer {
                Some(iss) => v.set_issuer(&[iss]),
                None => v.iss = None,
            }
            match &self.audience {
                Some(aud) => v.set_audience(&[aud]),
                None => v.validate_aud = false,
            }
            match jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
                token, &k.key, &v,
            ) {
                Ok(data) => {
                    let exp = data.claims.get("exp").and_then(|e| e.as_u64()).unwrap_or(0);
                    let principal = data
                        .claims
                        .get(&self.principal_claim)
                        .and_then(|p| p.as_str())
                        .filter(|p| !p.is_empty())
                        .ok_or_else(|| {
                            format!("the token has no string claim '{}'", self.principal_claim)
                        })?;
                    return Ok((principal.to_string(), exp));
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }
}

/// The token of an OAUTHBEARER client-first message (RFC 7628 section 3.1):
/// `gs2-header \x01 auth=Bearer <token> \x01 [key=value \x01]* \x01`.
pub fn client_token(bytes: &[u8]) -> Result<&str, &'static str> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8")?;
    let body = text
        .strip_suffix("\u{1}\u{1}")
        .ok_or("the message does not end with \\x01\\x01")?;
    let mut parts = body.split('\u{1}');
    let gs2 = parts.next().ok_or("empty message")?;
    if !(gs2.starts_with("n,") || gs2.starts_with("y,")) || !gs2.ends_with(',') {
        return Err("no GS2 header (n,,)");
    }
    let mut token = None;
    let mut seen = BTreeSet::new();
    for kv in parts {
        let (key, value) = kv.split_once('=').ok_or("a key without a value")?;
        if !seen.insert(key) {
            return Err("a key appears twice");
        }
        if key == "auth" {
            let t = value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
                .ok_or("auth is not a Bearer token")?;
            token = Some(t.trim());
        }
    }
    token
        .filter(|t| !t.is_empty())
        .ok_or("no auth=Bearer token")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_messages_are_parsed_strictly() {
        assert_eq!(
            client_token(b"n,,\x01auth=Bearer abc.def.ghi\x01\x01"),
            Ok("abc.def.ghi")
        );
        assert_eq!(
            client_token(b"n,a=alice,\x01host=h\x01auth=Bearer t.u.v\x01\x01"),
            Ok("t.u.v")
        );
        for bad in [
            &b""[..],
            b"n,,\x01auth=Bearer \x01\x01",
            b"n,,\x01auth=Basic abc\x01\x01",
            b"n,,\x01auth=Bearer a.b.c\x01",
            b"n,,\x01auth=Bearer a.b.c\x01auth=Bearer d.e.f\x01\x01",
            b"x,,\x01auth=Bearer a.b.c\x01\x01",
            b"n,,\x01auth=Bearer a.b.c\x01\x01junk",
            b"\xff\xfe",
        ] {
            assert!(client_token(bad).is_err(), "{bad:?}");
        }
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    /// A P-256 key pair: the JWKS holding its public half, and a signer.
    fn identity_provider(dir: &std::path::Path) -> (OAuthSection, jsonwebtoken::EncodingKey) {
        use base64::Engine;
        let pair = rcgen::KeyPair::generate().unwrap(); // ECDSA P-256
        let raw = pair.public_key_raw(); // 0x04 || x || y
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let jwks = serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig",
            "x": b64(&raw[1..33]), "y": b64(&raw[33..65]),
        }]});
        let path = dir.join("jwks.json");
        std::fs::write(&path, jwks.to_string()).unwrap();
        let section = OAuthSection {
            jwks: path,
            issuer: Some("https://idp.example".into()),
            audience: Some("strata".into()),
            principal_claim: "sub".into(),
            clock_skew: Duration::from_secs(0),
        };
        (
            section,
            jsonwebtoken::EncodingKey::from_ec_der(&pair.serialize_der()),
        )
    }

    #[test]
    fn tokens_are_checked_for_signature_issuer_audience_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let (section, signer) = identity_provider(dir.path());
        let v = Validator::load(&section).unwrap();
        let sign = |claims: serde_json::Value, kid: Option<&str>| {
            let mut header = jsonwebtoken::Header::new(Algorithm::ES256);
            header.kid = kid.map(String::from);
            jsonwebtoken::encode(&header, &claims, &signer).unwrap()
        };
        let good = serde_json::json!({
            "sub": "order-service", "iss": "https://idp.example", "aud": "strata",
            "exp": now() + 300,
        });
        assert_eq!(
            v.validate(&sign(good.clone(), Some("k1"))),
            Ok(("order-service".to_string(), now() + 300))
        );
        assert!(
            v.validate(&sign(good.clone(), None)).is_ok(),
            "no kid: every key is tried"
        );
        let with = |k: &str, val: serde_json::Value| {
            let mut c = good.clone();
            c[k] = val;
            c
        };
        for (claims, why) in [
            (with("exp", (now() - 10).into()), "expired"),
            (with("iss", "https://evil.example".into()), "issuer"),
            (with("aud", "other".into()), "audience"),
            (with("nbf", (now() + 600).into()), "not yet valid"),
            (with("sub", serde_json::Value::Null), "no principal"),
        ] {
            assert!(v.validate(&sign(claims, Some("k1"))).is_err(), "{why}");
        }
        for claim in ["exp", "iss", "aud"] {
            let mut without = good.clone();
            without.as_object_mut().unwrap().remove(claim);
            assert!(
                v.validate(&sign(without, Some("k1"))).is_err(),
                "{claim} is required when configured"
            );
        }
        assert!(
            v.validate(&sign(good.clone(), Some("k2"))).is_err(),
            "unknown kid"
        );
        // the same claims signed by another key, HMAC with a guessable secret, or unsigned
        let other = identity_provider(&dir.path().join("..")).1;
        let forged =
            jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::ES256), &good, &other)
                .unwrap();
        assert!(v.validate(&forged).is_err(), "another key");
        let hs = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &good,
            &jsonwebtoken::EncodingKey::from_secret(b"k1").unwrap(),
        )
        .unwrap();
        assert!(v.validate(&hs).is_err(), "HMAC");
        let signed = sign(good, Some("k1"));
        let claims = signed.split('.').nth(1).unwrap();
        let none = format!("eyJhbGciOiJub25lIn0.{claims}.");
        assert!(v.validate(&none).is_err(), "alg none");
    }

    #[test]
    fn symmetric_keys_and_mismatched_algorithms_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        let section = |p: &std::path::Path| OAuthSection {
            jwks: p.to_path_buf(),
            issuer: None,
            audience: None,
            principal_claim: "sub".into(),
            clock_skew: Duration::from_secs(0),
        };
        std::fs::write(&path, r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#).unwrap();
        let e = format!("{:#}", Validator::load(&section(&path)).unwrap_err());
        assert!(e.contains("symmetric"), "{e}");
        std::fs::write(&path, r#"{"keys":[]}"#).unwrap();
        assert!(Validator::load(&section(&path)).is_err());
        std::fs::write(&path, "not json").unwrap();
        let e = format!("{:#}", Validator::load(&section(&path)).unwrap_err());
        assert!(e.contains("not a JWKS"), "{e}");
    }
}
