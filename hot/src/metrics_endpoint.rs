//! The Prometheus endpoint (`GET /metrics`) on its own address, optionally over HTTPS and
//! behind HTTP basic authentication, so scrapes can cross a network without handing the
//! cluster's shape to whoever asks. It never renders a secret: the metrics hold counts,
//! sizes and names, not credentials.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::config::MetricsSection;
use crate::health::Health;
use crate::kafka::tls::{check_private, ClientAuth, TlsSection};

/// The `Authorization` header a scrape must send: `Basic base64(user:password)`.
fn expected_authorization(user: &str, password_file: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    check_private(password_file)?;
    let text = std::fs::read_to_string(password_file)
        .with_context(|| format!("reading {}", password_file.display()))?;
    let password = text.lines().next().unwrap_or_default();
    anyhow::ensure!(
        !password.is_empty() && !user.is_empty() && !user.contains(':'),
        "metrics.basic_auth needs a user without ':' and a password on the first line of {}",
        password_file.display()
    );
    let token = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("{user}:{password}"),
    );
    Ok(format!("Basic {token}").into_bytes())
}

fn authorized(headers: &HeaderMap, expected: Option<&[u8]>) -> bool {
    use subtle::ConstantTimeEq;
    match expected {
        None => true,
        Some(expected) => headers
            .get(header::AUTHORIZATION)
            .is_some_and(|got| bool::from(got.as_bytes().ct_eq(expected))),
    }
}

/// Serves `GET /metrics`, `/livez` and `/readyz` until `stop` turns true. Bound when the
/// process starts, before any role opens its data: the health endpoints answer through a
/// long recovery, and `/metrics` has what the roles that are up can tell.
pub async fn serve(
    health: Arc<Health>,
    section: &MetricsSection,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let expected = section
        .basic_auth
        .as_ref()
        .map(|b| expected_authorization(&b.user, &b.password_file))
        .transpose()
        .context("invalid [metrics.basic_auth]")?
        .map(Arc::<[u8]>::from);
    let acceptor = section
        .tls
        .as_ref()
        .map(|t| {
            let section = TlsSection {
                cert: t.cert.clone(),
                key: t.key.clone(),
                client_ca: None,
                client_auth: ClientAuth::None,
                cipher_suites: Vec::new(),
                protocols: Vec::new(),
            };
            crate::kafka::tls::acceptor(&section, ClientAuth::None)
        })
        .transpose()
        .context("invalid [metrics.tls]")?;
    let listener = TcpListener::bind(section.listen)
        .await
        .with_context(|| format!("binding the metrics listener on {}", section.listen))?;
    let local = listener.local_addr()?;
    tracing::info!(metrics = %local, https = acceptor.is_some(), basic_auth = expected.is_some(), "serving Prometheus metrics on /metrics, health on /livez and /readyz");
    let ready = health.clone();
    let registry = Arc::new(crate::metrics::registry(health));
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move |headers: HeaderMap| {
                let registry = registry.clone();
                let expected = expected.clone();
                async move {
                    if !authorized(&headers, expected.as_deref()) {
                        return (
                            StatusCode::UNAUTHORIZED,
                            [(header::WWW_AUTHENTICATE, "Basic realm=\"strata\"")],
                            "metrics need HTTP basic authentication\n",
                        )
                            .into_response();
                    }
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        crate::metrics::encode(&registry),
                    )
                        .into_response()
                }
            }),
        )
        // Probes carry no credentials (a kubelet's do not): the answers name no data.
        .route("/livez", axum::routing::get(|| async { "alive\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let ready = ready.clone();
                async move {
                    match ready.readiness() {
                        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
                        Err(why) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {why}\n"),
                        ),
                    }
                }
            }),
        );
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::spawn(async move {
        let served = match acceptor {
            None => {
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
            }
            Some(acceptor) => {
                axum::serve(TlsListener::start(listener, acceptor, local), app)
                    .with_graceful_shutdown(stopped)
                    .await
            }
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    });
    Ok(())
}

/// Connections whose TLS handshake finished; handshakes run concurrently (and give up after
/// ten seconds), so a slow client cannot hold up the scrapes behind it.
struct TlsListener {
    ready: mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    fn start(
        listener: TcpListener,
        acceptor: tokio_rustls::TlsAcceptor,
        local: SocketAddr,
    ) -> Self {
        let (tx, ready) = mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    _ = tx.closed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "metrics accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "metrics TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "metrics TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // the accept loop ended: nothing more will come
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_needs_the_exact_header() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        let expected = expected_authorization("prometheus", &pw).unwrap();
        assert_eq!(expected, b"Basic cHJvbWV0aGV1czpzM2NyZXQ=");
        let mut headers = HeaderMap::new();
        assert!(!authorized(&headers, Some(&expected)));
        headers.insert(
            header::AUTHORIZATION,
            "Basic cHJvbWV0aGV1czp3cm9uZw==".parse().unwrap(),
        );
        assert!(!authorized(&headers, Some(&expected)));
        headers.insert(
            header::AUTHORIZATION,
            "Basic cHJvbWV0aGV1czpzM2NyZXQ=".parse().unwrap(),
        );
        assert!(authorized(&headers, Some(&expected)));
        assert!(authorized(&HeaderMap::new(), None));
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = expected_authorization("prometheus", &pw)
            .unwrap_err()
            .to_string();
        assert!(e.contains("chmod 600"), "{e}");
    }
}
