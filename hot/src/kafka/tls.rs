//! TLS for the Kafka listeners (rustls): the server certificate chain and key from PEM files,
//! and optional client-certificate authentication against a CA (Kafka's `ssl.client.auth`).

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use serde::Deserialize;
use tokio_rustls::TlsAcceptor;

/// Whether clients must present a certificate signed by `client_ca`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    #[default]
    None,
    Requested,
    Required,
}

/// `[kafka.tls]`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
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
    /// Kafka's `ssl.cipher.suites`: the suites offered, by their IANA names, in the
    /// broker's order of preference (which then wins over the client's). Empty: every
    /// suite rustls offers (AES-256-GCM, AES-128-GCM and ChaCha20-Poly1305), in the
    /// client's order.
    #[serde(default)]
    pub cipher_suites: Vec<String>,
    /// Kafka's `ssl.enabled.protocols`: "TLSv1.3", "TLSv1.2". Empty: both.
    #[serde(default)]
    pub protocols: Vec<String>,
}

/// A suite's IANA name (rustls spells the TLS 1.3 ones `TLS13_…`; IANA and Kafka's JVM
/// spell them `TLS_AES_128_GCM_SHA256`).
fn iana_name(suite: &rustls::SupportedCipherSuite) -> Option<String> {
    let name = suite.suite().as_str()?;
    Some(match name.strip_prefix("TLS13_") {
        Some(rest) => format!("TLS_{rest}"),
        None => name.to_string(),
    })
}

/// The suites `cipher_suites` names, in its order: the provider's, by their IANA names
/// (rustls's `TLS13_` spelling is taken too).
fn suites(
    names: &[String],
    provider: &rustls::crypto::CryptoProvider,
) -> anyhow::Result<Vec<rustls::SupportedCipherSuite>> {
    let mut out = Vec::new();
    for name in names {
        let wanted = name.trim();
        let Some(suite) = provider.cipher_suites.iter().find(|s| {
            iana_name(s).as_deref() == Some(wanted) || s.suite().as_str() == Some(wanted)
        }) else {
            let known: Vec<String> = provider
                .cipher_suites
                .iter()
                .filter_map(iana_name)
                .collect();
            bail!(
                "kafka.tls.cipher_suites: unknown cipher suite {name:?}; known: {}",
                known.join(", ")
            );
        };
        if !out.contains(suite) {
            out.push(*suite);
        }
    }
    Ok(out)
}

/// The versions `protocols` may name.
fn versions(names: &[String]) -> anyhow::Result<Vec<&'static rustls::SupportedProtocolVersion>> {
    if names.is_empty() {
        return Ok(rustls::DEFAULT_VERSIONS.to_vec());
    }
    let mut out = Vec::new();
    for name in names {
        let v = match name.as_str() {
            "TLSv1.3" => &rustls::version::TLS13,
            "TLSv1.2" => &rustls::version::TLS12,
            other => bail!(
                "kafka.tls.protocols: unknown protocol {other:?}; use \"TLSv1.3\" and/or \"TLSv1.2\" \
                 (older versions are not offered)"
            ),
        };
        if !out
            .iter()
            .any(|o: &&rustls::SupportedProtocolVersion| o.version == v.version)
        {
            out.push(v);
        }
    }
    Ok(out)
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

/// The crypto provider with `cipher_suites` applied, and the versions `protocols` enables:
/// checked when the config is read, so a name that is off fails `strata config check`.
pub fn choices(
    t: &TlsSection,
) -> anyhow::Result<(
    rustls::crypto::CryptoProvider,
    Vec<&'static rustls::SupportedProtocolVersion>,
)> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if !t.cipher_suites.is_empty() {
        provider.cipher_suites = suites(&t.cipher_suites, &provider)?;
    }
    let versions = versions(&t.protocols)?;
    if !provider
        .cipher_suites
        .iter()
        .any(|s| versions.iter().any(|v| s.version().version == v.version))
    {
        bail!(
            "kafka.tls: no suite in cipher_suites works with the protocols enabled ({}); \
             add a TLSv1.3 suite such as TLS_AES_128_GCM_SHA256, or enable TLSv1.2",
            t.protocols.join(", ")
        );
    }
    Ok((provider, versions))
}

/// Builds the acceptor once at start, so a bad file fails the start with a clear error.
pub fn acceptor(t: &TlsSection, client_auth: ClientAuth) -> anyhow::Result<TlsAcceptor> {
    let (provider, versions) = choices(t)?;
    let provider = Arc::new(provider);
    let certs = certificates(&t.cert)?;
    check_private(&t.key)?;
    let key = PrivateKeyDer::from_pem_file(&t.key)
        .with_context(|| format!("reading the private key in {}", t.key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
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
    let mut config = builder.with_single_cert(certs, key).with_context(|| {
        format!(
            "the key in {} does not fit the certificate",
            t.key.display()
        )
    })?;
    // A configured list is the operator's order of preference.
    config.ignore_client_order = !t.cipher_suites.is_empty();
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The principal of a verified client certificate: `User:` and its subject's distinguished
/// name, as Kafka's default `ssl.principal.mapping.rules` give it (e.g. `User:CN=alice`).
pub fn principal(cert: &CertificateDer<'_>) -> Option<String> {
    strata_proto::tls::certificate_principal(cert.as_ref())
}

/// How much a TLS connection reads from its socket at a time.
const READ_AHEAD: usize = 64 * 1024;

/// What the TLS session above `ReadAhead` may hold of a frame that the frame reader has not
/// seen yet: rustls asks for at most a few KiB beyond the record it is deframing (16 KiB of
/// plaintext and its header and tag) and hands plaintext on a record at a time. The mark
/// stays this far below what the frame still needs, so the bytes it waits for are always
/// on their way.
const MARK_SLACK: usize = 64 * 1024;
/// Frames with less than this left are read as their bytes come (a mark would save little).
const MARK_FROM: usize = 96 * 1024;
/// The highest mark: one wake-up per quarter megabyte of a large produce frame.
const MARK_MAX: usize = 256 * 1024;

/// How many bytes of the frame being read the frame reader still needs, shared with the
/// `ReadAhead` under its TLS session (0 between frames).
#[derive(Debug, Default, Clone)]
pub struct FrameHint(Arc<HintState>);

#[derive(Debug, Default)]
struct HintState {
    needs: AtomicUsize,
    /// How often a mark above 1 was set on the socket.
    raised: AtomicUsize,
}

impl FrameHint {
    pub fn still_needs(&self, bytes: usize) {
        self.0.needs.store(bytes, Relaxed);
    }

    /// How often the socket's mark was raised for a large frame.
    pub fn raised(&self) -> usize {
        self.0.raised.load(Relaxed)
    }
}

/// The socket's receive low-water mark (`SO_RCVLOWAT`) for a frame that still needs
/// `remaining` bytes: 1 (wake on every byte) unless the frame has more than `MARK_FROM`
/// left, then `MARK_SLACK` less than that, at most `MARK_MAX`. Since the mark never asks for
/// more than the frame's own bytes still to come, its tail cannot wait behind it.
fn low_water(remaining: usize) -> usize {
    if remaining < MARK_FROM {
        1
    } else {
        (remaining - MARK_SLACK).min(MARK_MAX)
    }
}

/// A socket whose receive low-water mark can be set. Only TCP sockets have one.
pub trait LowWater {
    fn set_low_water(&self, bytes: usize) -> std::io::Result<()>;
}

impl LowWater for tokio::net::TcpStream {
    fn set_low_water(&self, bytes: usize) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: the descriptor is this stream's own and open for as long as `self` is
        // borrowed; the option value is a c_int that outlives the call, its size given.
        let rc = unsafe {
            libc::setsockopt(
                self.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// The socket beneath a TLS session, read in large chunks.
///
/// rustls asks its transport for at most 4 KiB at a time, so a connection streaming produce
/// requests through TLS would cost a read system call per 4 KiB, a quarter of a million per
/// GB. `ReadAhead` reads up to 64 KiB a call and hands it out from memory. Its buffer exists
/// only while bytes stream: it is freed whenever it is empty and the socket has nothing
/// more, so an idle connection holds none (tokio's `BufReader` would keep 64 KiB for every
/// connection, idle or not). Whatever the socket has is handed on at once: nothing waits for
/// the buffer to fill.
///
/// While a large frame is being read (`FrameHint`), it also raises the socket's receive
/// low-water mark, so the task sleeps until a good part of the frame has arrived instead
/// of waking for every TLS record (16 KiB) the client's writes happen to deliver; a
/// non-blocking read still returns whatever is there, so the mark only thins out wake-ups.
pub struct ReadAhead<S> {
    inner: S,
    buf: BytesMut,
    hint: Option<FrameHint>,
    /// The mark last set on the socket.
    mark: usize,
}

impl<S> ReadAhead<S> {
    pub fn new(inner: S) -> Self {
        ReadAhead {
            inner,
            buf: BytesMut::new(),
            hint: None,
            mark: 1,
        }
    }
}

impl<S: LowWater> ReadAhead<S> {
    /// Reads `inner` with its low-water mark following `hint`.
    pub fn with_hint(inner: S, hint: FrameHint) -> Self {
        ReadAhead {
            hint: Some(hint),
            ..ReadAhead::new(inner)
        }
    }
}

impl<S: AsyncRead + Unpin> ReadAhead<S> {
    fn poll_socket(
        &mut self,
        cx: &mut TaskContext<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if out.remaining() >= READ_AHEAD {
            return Pin::new(&mut self.inner).poll_read(cx, out);
        }
        self.buf.reserve(READ_AHEAD);
        match tokio_util::io::poll_read_buf(Pin::new(&mut self.inner), cx, &mut self.buf) {
            Poll::Pending => {
                self.buf = BytesMut::new();
                return Poll::Pending;
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Ready(Ok(_)) => {} // 0 bytes: the end of the stream, handed on as such
        }
        let n = self.buf.len().min(out.remaining());
        out.put_slice(&self.buf[..n]);
        self.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + LowWater + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.buf.is_empty() {
            let n = this.buf.len().min(out.remaining());
            out.put_slice(&this.buf[..n]);
            this.buf.advance(n);
            return Poll::Ready(Ok(()));
        }
        if let Some(hint) = &this.hint {
            let mark = low_water(hint.0.needs.load(Relaxed));
            if mark != this.mark {
                // Without the mark the connection only wakes more often; never fail a read
                // for it.
                match this.inner.set_low_water(mark) {
                    Ok(()) => {
                        if mark > this.mark {
                            hint.0.raised.fetch_add(1, Relaxed);
                        }
                        this.mark = mark;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot set the socket's receive low-water mark");
                        this.hint = None;
                    }
                }
            }
        }
        this.poll_socket(cx, out)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

    use super::{choices, low_water, ClientAuth, LowWater, ReadAhead, TlsSection};
    use super::{MARK_MAX, READ_AHEAD};

    fn section(suites: &[&str], protocols: &[&str]) -> TlsSection {
        TlsSection {
            cert: "node.pem".into(),
            key: "node.key".into(),
            client_ca: None,
            client_auth: ClientAuth::None,
            cipher_suites: suites.iter().map(|s| s.to_string()).collect(),
            protocols: protocols.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn cipher_suites_and_protocols_are_checked_by_name() {
        let (all, versions) = choices(&section(&[], &[])).unwrap();
        assert!(all.cipher_suites.len() >= 3);
        assert_eq!(versions.len(), 2);
        // IANA's and rustls's spelling, in the operator's order, duplicates dropped
        let (p, _) = choices(&section(
            &[
                "TLS_AES_128_GCM_SHA256",
                "TLS13_CHACHA20_POLY1305_SHA256",
                "TLS_AES_128_GCM_SHA256",
            ],
            &[],
        ))
        .unwrap();
        let names: Vec<_> = p.cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(
            names,
            [
                rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
                rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
            ]
        );
        let e = choices(&section(&["TLS_RSA_WITH_RC4_128_MD5"], &[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown cipher suite") && e.contains("TLS_AES_256_GCM_SHA384"),
            "{e}"
        );
        let e = choices(&section(&[], &["TLSv1.1"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown protocol \"TLSv1.1\""), "{e}");
        let (_, v) = choices(&section(&[], &["TLSv1.3"])).unwrap();
        assert_eq!(v.len(), 1);
        // a TLS 1.2 suite only, TLS 1.3 only: nothing could be negotiated
        let e = choices(&section(
            &["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
            &["TLSv1.3"],
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("no suite in cipher_suites works"), "{e}");
    }

    impl LowWater for tokio::io::DuplexStream {
        fn set_low_water(&self, _bytes: usize) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_mark_stays_below_what_a_frame_still_needs() {
        assert_eq!(low_water(0), 1);
        assert_eq!(low_water(95 * 1024), 1);
        for remaining in [96 * 1024, 100 * 1024, 300 * 1024, 64 << 20] {
            let mark = low_water(remaining);
            assert!(mark > 1 && mark <= MARK_MAX, "{remaining}: {mark}");
            assert!(mark + 64 * 1024 <= remaining, "{remaining}: {mark}");
        }
    }

    /// One poll_read of at most `n` bytes, with a waker that does nothing.
    fn poll_once<S: AsyncRead + LowWater + Unpin>(r: &mut ReadAhead<S>, n: usize) -> Poll<Vec<u8>> {
        let mut space = vec![0u8; n];
        let mut out = ReadBuf::new(&mut space);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(r).poll_read(&mut cx, &mut out) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(res) => {
                res.unwrap();
                Poll::Ready(out.filled().to_vec())
            }
        }
    }

    #[tokio::test]
    async fn read_ahead_hands_on_every_byte_in_order_and_holds_no_buffer_when_idle() {
        let (mut tx, rx) = tokio::io::duplex(4 * READ_AHEAD);
        let mut r = ReadAhead::new(rx);
        assert!(poll_once(&mut r, 4096).is_pending());
        assert_eq!(r.buf.capacity(), 0, "an idle connection holds a buffer");

        let sent: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
        tx.write_all(&sent).await.unwrap();
        let mut got = Vec::new();
        // small reads, as rustls makes them: one socket read fills the buffer
        let Poll::Ready(first) = poll_once(&mut r, 4096) else {
            panic!("150,000 bytes written, none read");
        };
        assert_eq!(first.len(), 4096);
        got.extend(first);
        assert!(
            r.buf.len() >= READ_AHEAD - 4096,
            "read {} ahead",
            r.buf.len()
        );
        while let Poll::Ready(b) = poll_once(&mut r, 4096) {
            assert!(!b.is_empty());
            got.extend(b);
        }
        assert_eq!(got, sent);
        assert_eq!(r.buf.capacity(), 0, "the buffer outlived the stream");

        // a partial chunk is handed on at once: the tail of a frame never waits for more
        tx.write_all(b"tail").await.unwrap();
        assert_eq!(poll_once(&mut r, 4096), Poll::Ready(b"tail".to_vec()));
        // a large read goes straight to the socket
        tx.write_all(&sent[..READ_AHEAD + 10]).await.unwrap();
        let big = poll_once(&mut r, 2 * READ_AHEAD);
        assert_eq!(big, Poll::Ready(sent[..READ_AHEAD + 10].to_vec()));
        assert!(poll_once(&mut r, 4096).is_pending());
        assert_eq!(r.buf.capacity(), 0, "the buffer outlived an idle socket");
        drop(tx);
        assert_eq!(
            poll_once(&mut r, 4096),
            Poll::Ready(vec![]),
            "end of stream"
        );
    }

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
