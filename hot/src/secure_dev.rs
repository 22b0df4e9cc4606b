//! `strata dev --secure`: the embedded single-node cluster locked down as a production one
//! would be (docs/security.md), with everything it needs made on first start under the data
//! directory: a development CA and certificates (`certs/`), and an `admin` SCRAM user whose
//! password is in `admin.password` (mode 600). The Kafka listener speaks SASL_SSL with
//! SCRAM, the gRPC ports mTLS, and nothing is allowed that no ACL allows except to `admin`.

use std::path::PathBuf;

use anyhow::Context;

use crate::config::{GrpcTlsSection, NamedListener, ServerConfig};
use crate::kafka::sasl::scram;
use crate::kafka::tls::{ClientAuth, TlsSection};
use crate::kafka::SecurityProtocol;

/// The user `strata dev --secure` makes a super user.
pub const ADMIN: &str = "admin";

/// What a client needs to connect to a secure dev node.
pub struct SecureDev {
    pub certs: PathBuf,
    pub password_file: PathBuf,
}

/// Turns a `strata dev` config into a secure one, making the certificates and the admin
/// password on first start (later starts reuse them).
pub fn secure(config: &mut ServerConfig) -> anyhow::Result<SecureDev> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("making {}", config.data_dir.display()))?;
    let certs = config.data_dir.join("certs");
    if !certs.join("node-broker-1.pem").exists() || !certs.join("client-admin.pem").exists() {
        let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let ip = config.kafka.listen.ip();
        if !ip.is_unspecified() && !hosts.contains(&ip.to_string()) {
            hosts.push(ip.to_string());
        }
        crate::certs::run(crate::certs::CertsArgs {
            out: certs.clone(),
            nodes: vec!["broker-1".into()],
            hosts,
            clients: vec![ADMIN.into()],
            days: 365,
        })
        .context("making the development certificates")?;
    }
    let password_file = config.data_dir.join("admin.password");
    if !password_file.exists() {
        let password = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            scram::random_bytes(18),
        );
        crate::certs::write_private(&password_file, &format!("{password}\n"))?;
    }
    let password = std::fs::read_to_string(&password_file)
        .with_context(|| format!("reading {}", password_file.display()))?
        .trim_end()
        .to_string();
    let (cert, key) = (
        certs.join("node-broker-1.pem"),
        certs.join("node-broker-1.key"),
    );
    config.kafka.listeners = vec![NamedListener {
        name: "SECURE".into(),
        listen: config.kafka.listen,
        protocol: SecurityProtocol::SaslSsl,
        advertised_host: config.kafka.advertised_host.clone(),
        advertised_port: config.kafka.advertised_port,
        client_auth: None,
    }];
    config.kafka.tls = Some(TlsSection {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: Some(certs.join("ca.pem")),
        client_auth: ClientAuth::None,
        cipher_suites: Vec::new(),
        protocols: Vec::new(),
    });
    config.kafka.sasl.mechanisms = vec!["SCRAM-SHA-512".into(), "SCRAM-SHA-256".into()];
    config.tls = Some(GrpcTlsSection {
        ca: certs.join("ca.pem"),
        cert,
        key,
    });
    for p in [format!("User:{ADMIN}"), format!("User:CN={ADMIN}")] {
        if !config.auth.super_users.contains(&p) {
            config.auth.super_users.push(p);
        }
    }
    config.bootstrap_users = vec![(ADMIN.to_string(), password)];
    config.validate()?;
    Ok(SecureDev {
        certs,
        password_file,
    })
}

impl SecureDev {
    /// How to connect, printed at start.
    pub fn instructions(&self, config: &ServerConfig) -> String {
        let c = self.certs.display();
        let pw = self.password_file.display();
        let kafka = config.kafka.listen;
        let controller = config
            .controller
            .as_ref()
            .map_or_else(String::new, |c| c.listen.to_string());
        format!(
            "strata dev --secure: Kafka on {kafka} speaks SASL_SSL (SCRAM-SHA-512), gRPC ports mTLS.\n\
             The super user is '{ADMIN}'; its password is in {pw}, its client certificate in {c}.\n\
             \n  kcat -b {kafka} -L -X security.protocol=SASL_SSL -X sasl.mechanisms=SCRAM-SHA-512 \\\n\
             \x20   -X sasl.username={ADMIN} -X sasl.password=\"$(cat {pw})\" -X ssl.ca.location={c}/ca.pem\n\
             \n  export STRATA_TLS_CA={c}/ca.pem STRATA_TLS_CERT={c}/client-{ADMIN}.pem STRATA_TLS_KEY={c}/client-{ADMIN}.key\n\
             \x20 strata quorum --controller {controller} describe\n\
             \x20 strata user --controller {controller} create alice --password-file alice.pw\n\
             \x20 strata acl --controller {controller} add --allow-principal User:alice --operation Write --topic orders\n"
        )
    }
}

/// Creates the bootstrap SCRAM users in the embedded controller's metadata, unless they
/// exist; waits for the single-voter quorum to elect itself.
pub async fn bootstrap_users(
    controller: &strata_controller::Controller,
    users: &[(String, String)],
) -> anyhow::Result<()> {
    use strata_controller::metadata::{Command, ScramMechanism};
    for (user, password) in users {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        for mechanism in [ScramMechanism::Sha512, ScramMechanism::Sha256] {
            let exists = controller
                .metadata()
                .borrow()
                .scram_credentials
                .get(user)
                .is_some_and(|m| m.contains_key(&mechanism));
            if exists {
                continue;
            }
            let credential = scram::derive(
                mechanism,
                password.as_bytes(),
                &scram::random_bytes(32),
                8192,
            );
            loop {
                let cmd = Command::UpsertScramCredential {
                    user: user.clone(),
                    mechanism,
                    credential: credential.clone(),
                };
                match controller.propose(cmd).await {
                    Ok(_) => break,
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::debug!(error = %e.message(), "waiting for the controller to lead");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                    Err(e) => anyhow::bail!("creating the SCRAM user '{user}': {}", e.message()),
                }
            }
        }
        tracing::info!(%user, "bootstrap SCRAM user ready");
    }
    Ok(())
}
