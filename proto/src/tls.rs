//! mTLS for Strata's gRPC planes (Raft between controllers, the controller API, the broker
//! data plane and the replica service) and the identity a peer's certificate proves.
//!
//! Every node holds one certificate signed by the cluster's CA. Its subject's common name
//! names the node: `controller-<id>` for a controller voter, `broker-<id>` for a broker
//! (`strata certs --node broker-1` makes one). Any other certificate is a user, whose
//! principal is `User:` and the subject (`User:CN=ops`), as on the Kafka listener. This
//! module only says who a peer is; what each may do is decided by the servers.

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// A TLS setting that cannot be used: a file is unreadable or holds no PEM.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {reason}")]
pub struct TlsError {
    what: &'static str,
    path: String,
    reason: String,
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let err = |reason: String| TlsError {
        what,
        path: path.display().to_string(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(err("holds no PEM block".into()));
    }
    Ok(pem)
}

/// This process's side of mTLS on gRPC: the CA that signs every node and user certificate,
/// and (for a node, or a user with a client certificate) its own certificate and key.
#[derive(Clone)]
pub struct GrpcTls {
    ca: Certificate,
    identity: Option<Identity>,
}

impl std::fmt::Debug for GrpcTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the key
        f.debug_struct("GrpcTls")
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl GrpcTls {
    /// Reads the CA and, when given, this side's certificate chain and key (PEM).
    pub fn load(ca: &Path, cert_and_key: Option<(&Path, &Path)>) -> Result<GrpcTls, TlsError> {
        // Both of rustls's providers are compiled in (the S3 client brings ring); tonic's
        // server side takes the process default, so name it once.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let ca = Certificate::from_pem(read_pem("CA certificate", ca)?);
        let identity = match cert_and_key {
            Some((cert, key)) => Some(Identity::from_pem(
                read_pem("certificate", cert)?,
                read_pem("private key", key)?,
            )),
            None => None,
        };
        Ok(GrpcTls { ca, identity })
    }

    /// The server side: this node's certificate, and a client certificate signed by the CA
    /// required of every peer.
    pub fn server(&self) -> Result<ServerTlsConfig, TlsError> {
        let identity = self.identity.clone().ok_or_else(|| TlsError {
            what: "server certificate",
            path: String::new(),
            reason: "a gRPC server needs its own certificate and key".into(),
        })?;
        Ok(ServerTlsConfig::new()
            .identity(identity)
            .client_ca_root(self.ca.clone())
            .timeout(std::time::Duration::from_secs(10)))
    }

    fn client(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new().ca_certificate(self.ca.clone());
        match &self.identity {
            Some(identity) => config.identity(identity.clone()),
            None => config,
        }
    }
}

/// An endpoint for `addr` (host:port): `https://` with this side's certificate when `tls`
/// is given, plaintext otherwise.
pub fn endpoint(addr: &str, tls: Option<&GrpcTls>) -> Result<Endpoint, tonic::transport::Error> {
    match tls {
        None => Endpoint::from_shared(format!("http://{addr}")),
        Some(tls) => Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls.client()),
    }
}

/// How often an idle internal connection proves its peer is alive (HTTP/2 PING), and how
/// long an unanswered PING may wait before the connection is dropped: a paused or cut-off
/// node is noticed within about three seconds instead of when TCP gives up (minutes).
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `endpoint`, for a connection that must notice a silent peer: HTTP/2 keepalive (PINGs
/// even while idle), TCP keepalive, and a 2 s connect timeout. Calls still need their own
/// deadlines; this covers streams and connections between calls.
pub fn live_endpoint(
    addr: &str,
    tls: Option<&GrpcTls>,
) -> Result<Endpoint, tonic::transport::Error> {
    Ok(endpoint(addr, tls)?
        .connect_timeout(std::time::Duration::from_secs(2))
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(std::time::Duration::from_secs(10)))
        .tcp_nodelay(true))
}

/// Who sent a request, as its TLS client certificate proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// The port does not use TLS: nothing is proven (a cluster without `[tls]`).
    Unauthenticated,
    /// A certificate whose CN is `controller-<id>`.
    Controller(u64),
    /// A certificate whose CN is `broker-<id>`.
    Broker(i32),
    /// Any other certificate: `User:` and its subject.
    User(String),
}

impl Peer {
    pub fn of<T>(req: &tonic::Request<T>) -> Peer {
        match req.peer_certs() {
            Some(certs) => certs
                .first()
                .map_or(Peer::Unauthenticated, |c| Peer::from_der(c.as_ref())),
            None => Peer::Unauthenticated,
        }
    }

    /// The identity a DER certificate names; a certificate that does not parse (tonic has
    /// verified it against the CA already, so that cannot happen) names a user nobody is.
    pub fn from_der(der: &[u8]) -> Peer {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return Peer::User(UNPARSABLE.into());
        };
        let subject = cert.subject();
        let cn = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok());
        if let Some(cn) = cn {
            if let Some(id) = cn.strip_prefix("controller-").and_then(node_id) {
                return Peer::Controller(id);
            }
            if let Some(id) = cn.strip_prefix("broker-").and_then(node_id) {
                if let Ok(id) = i32::try_from(id) {
                    return Peer::Broker(id);
                }
            }
        }
        Peer::User(subject_principal(subject))
    }

    /// The principal ACLs and `super_users` name: `User:CN=broker-1` for a node.
    pub fn principal(&self) -> Option<String> {
        match self {
            Peer::Unauthenticated => None,
            Peer::Controller(id) => Some(format!("User:CN=controller-{id}")),
            Peer::Broker(id) => Some(format!("User:CN=broker-{id}")),
            Peer::User(p) => Some(p.clone()),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Unauthenticated => f.write_str("an unauthenticated peer"),
            Peer::Controller(id) => write!(f, "controller {id}"),
            Peer::Broker(id) => write!(f, "broker {id}"),
            Peer::User(p) => f.write_str(p),
        }
    }
}

const UNPARSABLE: &str = "User:<unparsable certificate>";

/// `User:` and the subject's distinguished name, as Kafka's default
/// `ssl.principal.mapping.rules` give it (`User:CN=alice,O=Funds`).
fn subject_principal(subject: &x509_parser::x509::X509Name<'_>) -> String {
    format!("User:{subject}")
}

/// The principal of a certificate (DER) by its subject alone, as the Kafka listener names
/// clients; `None` when it does not parse.
pub fn certificate_principal(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(subject_principal(cert.subject()))
}

/// Digits only: `broker-01` or `broker-+1` are users, not broker 1.
fn node_id(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_plain_numbers() {
        assert_eq!(node_id("1"), Some(1));
        assert_eq!(node_id("0"), Some(0));
        assert_eq!(node_id("01"), None);
        assert_eq!(node_id("+1"), None);
        assert_eq!(node_id(""), None);
        assert_eq!(node_id("1x"), None);
    }

    #[test]
    fn principals_of_nodes_match_the_kafka_form() {
        assert_eq!(Peer::Broker(2).principal().unwrap(), "User:CN=broker-2");
        assert_eq!(
            Peer::Controller(1).principal().unwrap(),
            "User:CN=controller-1"
        );
        assert_eq!(Peer::Unauthenticated.principal(), None);
    }

    #[test]
    fn missing_files_and_non_pem_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("strata-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let e = GrpcTls::load(&junk, None).unwrap_err().to_string();
        assert!(e.contains("holds no PEM"), "{e}");
        let e = GrpcTls::load(&dir.join("absent.pem"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent.pem"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
