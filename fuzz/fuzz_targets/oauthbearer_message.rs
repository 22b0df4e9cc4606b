//! Any OAUTHBEARER client message (RFC 7628) is parsed or refused, never a panic, and any
//! token in it is refused by a validator whose JWKS holds one EC key nobody here can sign
//! with: no input authenticates.
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOCATOR: bounded_alloc::Bounded = bounded_alloc::Bounded;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use strata_hot::kafka::sasl::oauthbearer::{client_token, OAuthSection, Validator};

fn validator() -> &'static Validator {
    static V: OnceLock<Validator> = OnceLock::new();
    V.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("strata-fuzz-jwks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jwks.json");
        // A P-256 public key (the private half was thrown away).
        std::fs::write(
            &path,
            r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"k1",
                "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                "y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#,
        )
        .unwrap();
        Validator::load(&OAuthSection {
            jwks: path,
            issuer: None,
            audience: None,
            principal_claim: "sub".into(),
            clock_skew: std::time::Duration::from_secs(30),
        })
        .unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(token) = client_token(data) {
        assert!(validator().validate(token).is_err(), "an unsigned input authenticated");
    }
    if let Ok(token) = std::str::from_utf8(data) {
        assert!(validator().validate(token).is_err());
    }
});
