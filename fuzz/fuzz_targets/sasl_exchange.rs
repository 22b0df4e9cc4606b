//! Any sequence of SASL messages a client sends before it is authenticated (PLAIN, or the
//! two SCRAM messages, for each mechanism) is answered or refused, never a panic, and never
//! authenticates without the password. The first byte picks the mechanism; the rest is split
//! into messages at 0xFF bytes.
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOCATOR: bounded_alloc::Bounded = bounded_alloc::Bounded;

use libfuzzer_sys::fuzz_target;
use strata_controller::metadata::{ScramCredential, ScramMechanism};
use strata_hot::kafka::sasl::{scram, Credentials, Mechanism, SaslSession};

struct Alice(ScramCredential, ScramCredential);

impl Credentials for Alice {
    fn scram(&self, user: &str, m: ScramMechanism) -> Option<ScramCredential> {
        (user == "alice").then(|| match m {
            ScramMechanism::Sha256 => self.0.clone(),
            ScramMechanism::Sha512 => self.1.clone(),
        })
    }
    fn stand_in(&self, user: &str, m: ScramMechanism) -> ScramCredential {
        scram::stand_in(b"fuzz", m, user, 4096)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let creds = Alice(
        scram::derive(ScramMechanism::Sha256, b"pw", &[1; 16], 4096),
        scram::derive(ScramMechanism::Sha512, b"pw", &[1; 16], 4096),
    );
    let mechanisms = [
        Mechanism::Plain,
        Mechanism::Scram(ScramMechanism::Sha256),
        Mechanism::Scram(ScramMechanism::Sha512),
    ];
    let m = mechanisms[usize::from(pick) % mechanisms.len()];
    let mut session = SaslSession::new(mechanisms.to_vec());
    session.handshake(m.name()).expect("an offered mechanism");
    for message in rest.split(|b| *b == 0xFF).take(4) {
        match session.authenticate(message, &creds) {
            Ok(step) => {
                if let Some(user) = step.authenticated {
                    // only PLAIN with the right password can get here from fuzzed bytes
                    assert_eq!(m, Mechanism::Plain);
                    assert_eq!(user, "alice");
                    assert!(message.ends_with(b"\0pw"));
                }
            }
            Err(_) => return,
        }
    }
});
