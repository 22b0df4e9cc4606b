//! `strata dev --secure`: the embedded single-node cluster locked down as a production one
//! would be (docs/security.md), with everything it needs made on first start under the data
//! directory: a development CA and certificates (`certs/`), an `admin` SCRAM user whose
//! password is in `admin.password`, and a `prometheus` scrape password in `metrics.password`
//! (all mode 600, in a directory of mode 700). The Kafka listener speaks SASL_SSL with
//! SCRAM, the gRPC ports mTLS, `/metrics` HTTPS with basic auth, and nothing is allowed that
//! no ACL allows except to `admin`.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::{BasicAuthSection, GrpcTlsSection, MetricsTls, NamedListener, ServerConfig};
use crate::kafka::sasl::scram;
use crate::kafka::tls::{ClientAuth, TlsSection};
use crate::kafka::SecurityProtocol;

/// The user `strata dev --secure` makes a super user.
pub const ADMIN: &str = "admin";

/// The basic-auth user of `/metrics` on a secure dev node (unless the config names one).
pub const SCRAPER: &str = "prometheus";

/// What a client needs to connect to a secure dev node.
pub struct SecureDev {
    pub certs: PathBuf,
    pub password_file: PathBuf,
    /// The metrics endpoint's basic-auth user and password file, when it is on.
    pub metrics: Option<(String, PathBuf)>,
}

/// The password in `path`, made (random, mode 600) when the file is missing.
fn secret(path: &Path) -> anyhow::Result<String> {
    if !path.exists() {
        let password = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            scram::random_bytes(18),
        );
        crate::certs::write_private(path, &format!("{password}\n"))?;
    }
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("reading {}", path.display()))?
        .trim_end()
        .to_string())
}

/// Turns a `strata dev` config into a secure one, making the certificates and the admin
/// password on first start (later starts reuse them).
pub fn secure(config: &mut ServerConfig) -> anyhow::Result<SecureDev> {
    strata_core::private_fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("making {}", config.data_dir.display()))?;
    let certs = config.data_dir.join("certs");
    if !certs.join("node-broker-1.pem").exists() || !certs.join("client-admin.pem").exists() {
        let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let ip = config.kafka.listen.ip();
        if !ip.is_unspecified() && !hosts.contains(&ip.to_string()) {
            hosts.push(ip.to_string());
        }
        let args = crate::certs::CertsArgs {
            out: certs.clone(),
            nodes: vec!["broker-1".into()],
            hosts,
            clients: vec![ADMIN.into()],
            days: 365,
        };
        crate::certs::make(&args, crate::certs::CertFiles::OwnerOnly)
            .context("making the development certificates")?;
    }
    let password_file = config.data_dir.join("admin.password");
    let password = secret(&password_file)?;
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
    // Scrapes like the rest: over TLS, with a password of their own (not the admin's).
    let metrics = match config.metrics.as_mut() {
        None => None,
        Some(m) => {
            m.tls.get_or_insert_with(|| MetricsTls {
                cert: cert.clone(),
                key: key.clone(),
            });
            let auth = match &m.basic_auth {
                Some(auth) => auth.clone(),
                None => {
                    let password_file = config.data_dir.join("metrics.password");
                    secret(&password_file)?;
                    m.basic_auth
                        .insert(BasicAuthSection {
                            user: SCRAPER.into(),
                            password_file,
                        })
                        .clone()
                }
            };
            Some((auth.user, auth.password_file))
        }
    };
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
        metrics,
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
        let mut text = format!(
            "strata dev --secure: Kafka on {kafka} speaks SASL_SSL (SCRAM-SHA-512), gRPC ports mTLS.\n\
             The super user is '{ADMIN}'; its password is in {pw}, its client certificate in {c}.\n\
             \n  kcat -b {kafka} -L -X security.protocol=SASL_SSL -X sasl.mechanisms=SCRAM-SHA-512 \\\n\
             \x20   -X sasl.username={ADMIN} -X sasl.password=\"$(cat {pw})\" -X ssl.ca.location={c}/ca.pem\n\
             \n  export STRATA_TLS_CA={c}/ca.pem STRATA_TLS_CERT={c}/client-{ADMIN}.pem STRATA_TLS_KEY={c}/client-{ADMIN}.key\n\
             \x20 strata quorum --controller {controller} describe\n\
             \x20 strata user --controller {controller} create alice --password-file alice.pw\n\
             \x20 strata acl --controller {controller} add --allow-principal User:alice --operation Write --topic orders\n"
        );
        if let (Some((user, password_file)), Some(m)) = (&self.metrics, &config.metrics) {
            let (listen, mpw) = (m.listen, password_file.display());
            text.push_str(&format!(
                "\n/metrics on {listen} speaks HTTPS only, with basic auth: user '{user}', password in {mpw}.\n\
                 \n  curl --cacert {c}/ca.pem -u \"{user}:$(cat {mpw})\" https://{listen}/metrics\n"
            ));
        }
        text
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
                scram::DEFAULT_ITERATIONS,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DevFlags;
    use std::os::unix::fs::PermissionsExt;

    /// Every directory and file under `dir` with a mode other than 700 / 600.
    fn open_to_others(dir: &Path, out: &mut Vec<String>) {
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        if mode(dir) != 0o700 {
            out.push(format!("{} {:o}", dir.display(), mode(dir)));
        }
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                open_to_others(&path, out);
            } else if mode(&path) != 0o600 {
                out.push(format!("{} {:o}", path.display(), mode(&path)));
            }
        }
    }

    #[test]
    fn metrics_are_served_over_tls_behind_a_password_of_their_own_and_every_file_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let flags = DevFlags {
            data_dir: Some(data.clone()),
            metrics: Some("127.0.0.1:19096".into()),
            ..DevFlags::default()
        };
        let mut config = ServerConfig::dev(None, flags, std::iter::empty()).unwrap();
        let secured = secure(&mut config).unwrap();
        let m = config.metrics.as_ref().expect("metrics on");
        let tls = m.tls.as_ref().expect("metrics over TLS");
        assert_eq!(tls.key, data.join("certs").join("node-broker-1.key"));
        let auth = m.basic_auth.as_ref().expect("metrics behind basic auth");
        assert_eq!(auth.user, SCRAPER);
        assert_eq!(auth.password_file, data.join("metrics.password"));
        let password = std::fs::read_to_string(&auth.password_file).unwrap();
        let admin = std::fs::read_to_string(data.join("admin.password")).unwrap();
        assert!(password.trim().len() >= 20 && password != admin);

        let text = secured.instructions(&config);
        let curl = format!(
            "curl --cacert {}/ca.pem -u \"prometheus:$(cat {})\" https://127.0.0.1:19096/metrics",
            data.join("certs").display(),
            auth.password_file.display()
        );
        assert!(text.contains(&curl), "{text}");
        assert!(!text.contains(password.trim()) && !text.contains(admin.trim()));

        let mut open = Vec::new();
        open_to_others(&data, &mut open);
        assert!(open.is_empty(), "open to other users: {open:?}");

        // A second start keeps both passwords.
        let mut again = ServerConfig::dev(
            None,
            DevFlags {
                data_dir: Some(data.clone()),
                metrics: Some("127.0.0.1:19096".into()),
                ..DevFlags::default()
            },
            std::iter::empty(),
        )
        .unwrap();
        secure(&mut again).unwrap();
        assert_eq!(
            std::fs::read_to_string(data.join("metrics.password")).unwrap(),
            password
        );
    }

    #[test]
    fn without_a_metrics_address_there_is_nothing_to_scrape() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let flags = DevFlags {
            data_dir: Some(data.clone()),
            listen: Some("127.0.0.1:19092".into()),
            ..DevFlags::default()
        };
        let mut config = ServerConfig::dev(None, flags, std::iter::empty()).unwrap();
        let secured = secure(&mut config).unwrap();
        assert!(config.metrics.is_none() && secured.metrics.is_none());
        assert!(!data.join("metrics.password").exists());
        assert!(!secured.instructions(&config).contains("/metrics"));
    }
}
