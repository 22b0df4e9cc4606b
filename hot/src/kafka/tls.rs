//! TLS for the Kafka listeners (rustls): the server certificate chain and key from PEM files,
//! and optional client-certificate authentication against a CA (Kafka's `ssl.client.auth`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use serde::Deserialize;
use tokio_rustls::TlsAcceptor;

/// Whether clients must present a certificate signed by `client_ca`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    #[default]
    None,
    Requested,
    Required,
}

/// `[kafka.tls]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1). Refused when other users may read it.
    pub key: PathBuf,
    /// PEM CA certificates that sign client certificates.
    pub client_ca: Option<PathBuf>,
    #[serde(default)]
    pub client_auth: ClientAuth,
}

/// Refuses a secret file (a TLS key, a password file) that users other than its owner may
/// read.
pub fn check_private(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "{} holds a secret but its mode is {:o}; make it private: chmod 600 {}",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    Ok(())
}

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing certificates in {}", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

/// Builds the acceptor once at start, so a bad file fails the start with a clear error.
pub fn acceptor(t: &TlsSection, client_auth: ClientAuth) -> anyhow::Result<TlsAcceptor> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let certs = certificates(&t.cert)?;
    check_private(&t.key)?;
    let key = PrivateKeyDer::from_pem_file(&t.key)
        .with_context(|| format!("reading the private key in {}", t.key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("choosing TLS versions")?;
    let builder = match (client_auth, &t.client_ca) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => bail!("kafka.tls.client_auth needs kafka.tls.client_ca"),
        (auth, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for c in certificates(ca)? {
                roots
                    .add(c)
                    .with_context(|| format!("adding a CA certificate from {}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().context("client CA")?)
        }
    };
    let config = builder.with_single_cert(certs, key).with_context(|| {
        format!(
            "the key in {} does not fit the certificate",
            t.key.display()
        )
    })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The principal of a verified client certificate: `User:` and its subject's distinguished
/// name, as Kafka's default `ssl.principal.mapping.rules` give it (e.g. `User:CN=alice`).
pub fn principal(cert: &CertificateDer<'_>) -> Option<String> {
    strata_proto::tls::certificate_principal(cert.as_ref())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_key_others_may_read_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("node.key");
        std::fs::write(&key, "not really a key").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = super::check_private(&key).unwrap_err().to_string();
        assert!(e.contains("mode is 644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(super::check_private(&key).is_ok());
    }
}
