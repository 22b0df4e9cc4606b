//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server's side, without I/O:
//! messages in, messages out. The server keeps only salted, iterated stored and server keys
//! ([`ScramCredential`]); a password is seen only by [`derive`], on the client's side (the
//! `strata user` CLI) or to check a SASL/PLAIN login against the same keys.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256, Sha512};
use strata_controller::metadata::{ScramCredential, ScramMechanism};
use subtle::ConstantTimeEq;

/// Why an exchange failed. The message goes to the client as is, so it never says whether
/// the user exists.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("authentication failed: invalid user name or password")]
    BadCredentials,
    #[error("{0} is not supported")]
    Unsupported(&'static str),
}

fn hmac_with<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = <M as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

fn hmac(m: ScramMechanism, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match m {
        ScramMechanism::Sha256 => hmac_with::<Hmac<Sha256>>(key, parts),
        ScramMechanism::Sha512 => hmac_with::<Hmac<Sha512>>(key, parts),
    }
}

fn hash(m: ScramMechanism, data: &[u8]) -> Vec<u8> {
    match m {
        ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
        ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
    }
}

/// RFC 5802 `Hi()`: PBKDF2 with the mechanism's HMAC and one output block.
fn hi(m: ScramMechanism, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut u = hmac(m, password, &[salt, &1u32.to_be_bytes()]);
    let mut out = u.clone();
    for _ in 1..iterations {
        u = hmac(m, password, &[&u]);
        out.iter_mut().zip(&u).for_each(|(o, x)| *o ^= x);
    }
    out
}

/// The keys a server stores for `password` (RFC 5802 section 3).
pub fn derive(m: ScramMechanism, password: &[u8], salt: &[u8], iterations: u32) -> ScramCredential {
    from_salted(m, &hi(m, password, salt, iterations), salt, iterations)
}

/// The keys a server stores, from the salted password a client computed (Kafka's
/// AlterUserScramCredentials sends `Hi(password, salt, i)`, never the password).
pub fn from_salted(
    m: ScramMechanism,
    salted: &[u8],
    salt: &[u8],
    iterations: u32,
) -> ScramCredential {
    let salted = salted.to_vec();
    let client_key = hmac(m, &salted, &[b"Client Key"]);
    ScramCredential {
        salt: salt.to_vec(),
        iterations,
        stored_key: hash(m, &client_key),
        server_key: hmac(m, &salted, &[b"Server Key"]),
    }
}

/// Whether `password` is the one `credential` was derived from (SASL/PLAIN against SCRAM
/// credentials), compared in constant time.
pub fn password_matches(m: ScramMechanism, credential: &ScramCredential, password: &[u8]) -> bool {
    let salted = hi(m, password, &credential.salt, credential.iterations);
    let stored = hash(m, &hmac(m, &salted, &[b"Client Key"]));
    bool::from(stored.ct_eq(&credential.stored_key))
}

/// Iterations a stand-in credential uses when no real credential of its mechanism exists:
/// what `strata user create` gives.
pub const DEFAULT_ITERATIONS: u32 = 8192;

/// The credential a user that does not exist is answered with (issue 47): its salt is the
/// same at every login and looks like a real one, so that the exchange of an unknown user
/// cannot be told from a real user's; its keys are derived from `key` (a secret only the
/// metadata holds) and fit no password. `iterations` should be what real users have.
pub fn stand_in(key: &[u8], m: ScramMechanism, user: &str, iterations: u32) -> ScramCredential {
    let derived = |what: &[u8]| hmac(m, key, &[what, m.name().as_bytes(), b"\0", user.as_bytes()]);
    ScramCredential {
        salt: hmac(
            ScramMechanism::Sha256,
            key,
            &[b"salt\0", m.name().as_bytes(), b"\0", user.as_bytes()],
        ),
        iterations,
        stored_key: derived(b"stored\0"),
        server_key: derived(b"server\0"),
    }
}

/// Random bytes from the operating system.
/// The client's side of the exchange (RFC 5802), for tools and benchmarks that log in over
/// SASL/SCRAM: the client-final message answering `server_first`, for a client that sent
/// `client_first_bare` (`n=<user>,r=<client nonce>`, after the `n,,` GS2 header).
pub fn client_final(
    m: ScramMechanism,
    password: &[u8],
    client_first_bare: &str,
    server_first: &str,
) -> Result<String, ScramError> {
    let field = |key: &str| {
        server_first
            .split(',')
            .find_map(|f| f.strip_prefix(key))
            .ok_or(ScramError::Malformed("server-first message lacks a field"))
    };
    let nonce = field("r=")?;
    let client_nonce = client_first_bare
        .split(',')
        .find_map(|f| f.strip_prefix("r="))
        .unwrap_or_default();
    if !nonce.starts_with(client_nonce) || nonce.len() <= client_nonce.len() {
        return Err(ScramError::Malformed(
            "the server's nonce does not extend the client's",
        ));
    }
    let salt = B64
        .decode(field("s=")?)
        .map_err(|_| ScramError::Malformed("the salt is not base64"))?;
    let iterations: u32 = field("i=")?
        .parse()
        .map_err(|_| ScramError::Malformed("the iteration count is not a number"))?;
    let salted = hi(m, password, &salt, iterations);
    let client_key = hmac(m, &salted, &[b"Client Key"]);
    let stored = hash(m, &client_key);
    let without_proof = format!("c=biws,r={nonce}");
    let auth = format!("{client_first_bare},{server_first},{without_proof}");
    let sig = hmac(m, &stored, &[auth.as_bytes()]);
    let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
    Ok(format!("{without_proof},p={}", B64.encode(proof)))
}

pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("the operating system's random source works");
    b
}

/// A saslname with `=2C` and `=3D` decoded; any other `=` is malformed (RFC 5802 5.1).
fn decode_saslname(s: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape in user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// One `x=value` attribute.
fn attribute(part: &str, name: char) -> Option<&str> {
    let mut chars = part.chars();
    (chars.next() == Some(name) && chars.next() == Some('=')).then(|| &part[2..])
}

enum State {
    AwaitClientFirst,
    AwaitClientFinal {
        user: String,
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
        /// A stand-in for an unknown user (`known` false): the exchange goes on alike and
        /// fails at the proof, so a client cannot tell unknown users from wrong passwords.
        credential: Box<ScramCredential>,
        known: bool,
    },
    Done,
}

/// The server's side of one SCRAM exchange.
pub struct ScramServer {
    mechanism: ScramMechanism,
    state: State,
}

impl ScramServer {
    pub fn new(mechanism: ScramMechanism) -> ScramServer {
        ScramServer {
            mechanism,
            state: State::AwaitClientFirst,
        }
    }

    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Whether the next client message is the first one.
    pub fn awaits_client_first(&self) -> bool {
        matches!(self.state, State::AwaitClientFirst)
    }

    /// Answers the client-first message with the server-first message. `lookup` gives the
    /// user's credential and whether the user exists (a stand-in otherwise, see [`stand_in`]).
    pub fn client_first(
        &mut self,
        msg: &[u8],
        lookup: impl FnOnce(&str) -> (ScramCredential, bool),
    ) -> Result<Vec<u8>, ScramError> {
        if !matches!(self.state, State::AwaitClientFirst) {
            return Err(ScramError::Malformed("client-first message out of order"));
        }
        self.state = State::Done;
        let msg = std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        // gs2-header: cbind flag, optional authzid, then the bare message.
        let (flag, rest) = msg
            .split_once(',')
            .ok_or(ScramError::Malformed("no GS2 header"))?;
        match flag {
            "n" | "y" => {}
            f if f.starts_with("p=") => return Err(ScramError::Unsupported("channel binding")),
            _ => return Err(ScramError::Malformed("bad channel binding flag")),
        }
        let (authzid, bare) = rest
            .split_once(',')
            .ok_or(ScramError::Malformed("no GS2 header"))?;
        let gs2_header = format!("{flag},{authzid},");
        let mut parts = bare.split(',');
        let first = parts.next().unwrap_or_default();
        if attribute(first, 'm').is_some() {
            return Err(ScramError::Unsupported("a mandatory SCRAM extension"));
        }
        let user =
            decode_saslname(attribute(first, 'n').ok_or(ScramError::Malformed("no user name"))?)?;
        let client_nonce = parts
            .next()
            .and_then(|p| attribute(p, 'r'))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b','))
            .ok_or(ScramError::Malformed("no client nonce"))?;
        for ext in parts {
            if attribute(ext, 't').is_some() || ext.starts_with("tokenauth=") {
                return Err(ScramError::Unsupported("delegation token authentication"));
            }
        }
        if !authzid.is_empty() {
            let authzid = decode_saslname(
                attribute(authzid, 'a').ok_or(ScramError::Malformed("bad authorization id"))?,
            )?;
            if authzid != user {
                return Err(ScramError::BadCredentials);
            }
        }
        if user.is_empty() {
            return Err(ScramError::Malformed("empty user name"));
        }
        let (credential, known) = lookup(&user);
        let nonce = format!("{client_nonce}{}", B64.encode(random_bytes(24)));
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        self.state = State::AwaitClientFinal {
            user,
            gs2_header,
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
            credential: Box::new(credential),
            known,
        };
        Ok(server_first.into_bytes())
    }

    /// Checks the client-final message's proof; answers with the server-final message and
    /// the authenticated user.
    pub fn client_final(&mut self, msg: &[u8]) -> Result<(Vec<u8>, String), ScramError> {
        let State::AwaitClientFinal {
            user,
            gs2_header,
            client_first_bare,
            server_first,
            nonce,
            credential,
            known,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(ScramError::Malformed("client-final message out of order"));
        };
        let msg = std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (without_proof, proof) = msg
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("no proof"))?;
        let mut parts = without_proof.split(',');
        let binding = parts
            .next()
            .and_then(|p| attribute(p, 'c'))
            .ok_or(ScramError::Malformed("no channel binding"))?;
        if B64.decode(binding).ok().as_deref() != Some(gs2_header.as_bytes()) {
            return Err(ScramError::Malformed(
                "channel binding differs from the GS2 header",
            ));
        }
        // RFC 5802 wants the nonce echoed; librdkafka sends its own nonce again in front of
        // it, and Kafka accepts any nonce that ends with the server's, so we do too.
        if !parts
            .next()
            .and_then(|p| attribute(p, 'r'))
            .is_some_and(|r| r.ends_with(nonce.as_str()))
        {
            return Err(ScramError::Malformed("nonce differs from the server's"));
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("proof is not base64"))?;
        let m = self.mechanism;
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature = hmac(m, &credential.stored_key, &[auth_message.as_bytes()]);
        if proof.len() != client_signature.len() {
            return Err(ScramError::BadCredentials);
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        if !(bool::from(hash(m, &client_key).ct_eq(&credential.stored_key)) && known) {
            return Err(ScramError::BadCredentials);
        }
        let server_signature = hmac(m, &credential.server_key, &[auth_message.as_bytes()]);
        Ok((
            format!("v={}", B64.encode(server_signature)).into_bytes(),
            user,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3's example exchange (SCRAM-SHA-256, user "user", password
    /// "pencil"), with the server's nonce and salt made the RFC's.
    #[test]
    fn rfc7677_test_vector() {
        let m = ScramMechanism::Sha256;
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = derive(m, b"pencil", &salt, 4096);
        let client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let server_first =
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let without_proof = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let mut server = ScramServer::new(m);
        server.state = State::AwaitClientFinal {
            user: "user".into(),
            gs2_header: "n,,".into(),
            client_first_bare: client_first_bare.into(),
            server_first: server_first.into(),
            nonce: "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
            credential: Box::new(credential),
            known: true,
        };
        let final_msg = format!("{without_proof},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
        let (server_final, user) = server.client_final(final_msg.as_bytes()).unwrap();
        assert_eq!(user, "user");
        assert_eq!(
            String::from_utf8(server_final).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    fn exchange(
        m: ScramMechanism,
        stored_password: &[u8],
        password: &[u8],
        user_known: bool,
    ) -> Result<String, ScramError> {
        let credential = derive(m, stored_password, &random_bytes(16), 4096);
        let mut server = ScramServer::new(m);
        let bare = "n=alice,r=abcdef";
        let server_first = server.client_first(format!("n,,{bare}").as_bytes(), |u| {
            match user_known && u == "alice" {
                true => (credential.clone(), true),
                // even a stand-in that a password would fit is refused
                false => (credential.clone(), false),
            }
        })?;
        let server_first = String::from_utf8(server_first).unwrap();
        let msg = super::client_final(m, password, bare, &server_first).unwrap();
        server.client_final(msg.as_bytes()).map(|(_, u)| u)
    }

    #[test]
    fn right_and_wrong_passwords_for_both_mechanisms() {
        for m in ScramMechanism::ALL {
            assert_eq!(exchange(m, b"s3cret", b"s3cret", true), Ok("alice".into()));
            assert_eq!(
                exchange(m, b"s3cret", b"guess", true),
                Err(ScramError::BadCredentials)
            );
            // an unknown user fails the same way, at the same step
            assert_eq!(
                exchange(m, b"s3cret", b"s3cret", false),
                Err(ScramError::BadCredentials)
            );
        }
    }

    /// Issue 47: an unknown user was answered with a new random salt each time and 4,096
    /// iterations, a real one with the same salt and 8,192: users could be enumerated.
    #[test]
    fn an_unknown_users_stand_in_is_the_same_at_every_login_and_unique_to_the_user() {
        let first_message = |c: ScramCredential, known: bool| {
            let mut server = ScramServer::new(ScramMechanism::Sha512);
            let first = server
                .client_first(b"n,,n=bob,r=abcdef", |_| (c, known))
                .unwrap();
            let first = String::from_utf8(first).unwrap();
            // the server's nonce differs each time; salt and iterations are what is compared
            first.split(',').skip(1).collect::<Vec<_>>().join(",")
        };
        let m = ScramMechanism::Sha512;
        let bob = stand_in(b"secret", m, "bob", 8192);
        assert_eq!(bob, stand_in(b"secret", m, "bob", 8192), "deterministic");
        assert_eq!((bob.salt.len(), bob.stored_key.len()), (32, 64));
        assert_eq!(
            first_message(bob.clone(), false),
            first_message(stand_in(b"secret", m, "bob", 8192), false),
            "two logins of an unknown user see the same salt and iterations"
        );
        assert!(first_message(bob.clone(), false).ends_with(",i=8192"));
        for other in [
            stand_in(b"secret", m, "carol", 8192),
            stand_in(b"other secret", m, "bob", 8192),
            stand_in(b"secret", ScramMechanism::Sha256, "bob", 8192),
        ] {
            assert_ne!(other.salt, bob.salt);
            assert_ne!(other.stored_key, bob.stored_key);
        }
    }

    #[test]
    fn plain_passwords_are_checked_against_the_stored_key() {
        let m = ScramMechanism::Sha512;
        let c = derive(m, b"s3cret", &random_bytes(16), 4096);
        assert!(password_matches(m, &c, b"s3cret"));
        assert!(!password_matches(m, &c, b"s3cres"));
    }

    #[test]
    fn malformed_messages_are_refused() {
        let bad: &[&[u8]] = &[
            b"",
            b"n",
            b"x,,n=a,r=b",
            b"p=tls-unique,,n=a,r=b",
            b"n,,r=b",
            b"n,,n=a",
            b"n,,n=a=,r=b",
            b"n,,m=ext,n=a,r=b",
            b"n,,n=a,r=b,tokenauth=true",
            b"n,a=bob,n=a,r=b",
            b"\xff\xfe",
        ];
        for msg in bad {
            let mut s = ScramServer::new(ScramMechanism::Sha256);
            assert!(
                s.client_first(msg, |u| (
                    stand_in(b"k", ScramMechanism::Sha256, u, 4096),
                    false
                ))
                .is_err(),
                "{:?}",
                String::from_utf8_lossy(msg)
            );
        }
        let mut s = ScramServer::new(ScramMechanism::Sha256);
        assert!(
            s.client_final(b"c=biws,r=x,p=AAAA").is_err(),
            "final before first"
        );
    }

    #[test]
    fn user_names_are_unescaped() {
        assert_eq!(decode_saslname("a=2Cb=3Dc").unwrap(), "a,b=c");
        assert!(decode_saslname("a=2").is_err());
    }
}
