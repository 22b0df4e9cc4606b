//! `strata certs`: a development CA and the certificates a local secure cluster needs
//! (nodes with their host names and addresses, clients with their user name as CN, which
//! becomes their principal). Production clusters use their own PKI; see docs/security.md.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

#[derive(clap::Args)]
pub struct CertsArgs {
    /// Directory for ca.pem / ca.key and the certificates (made if missing). An existing
    /// CA there is reused, so certificates can be added or renewed later.
    #[arg(long, default_value = "./strata-certs")]
    pub out: PathBuf,
    /// A node certificate: NAME, valid for every --host (repeatable).
    #[arg(long = "node")]
    pub nodes: Vec<String>,
    /// Host names and IP addresses the node certificates are valid for (repeatable).
    #[arg(long = "host", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string()])]
    pub hosts: Vec<String>,
    /// A client certificate for user NAME (CN=NAME) (repeatable).
    #[arg(long = "client")]
    pub clients: Vec<String>,
    /// Validity of new certificates, in days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
}

/// Who may read the files `strata certs` writes. Private keys are always their owner's
/// alone; this decides for the directory and the certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertFiles {
    /// `strata certs`: certificates as the umask allows, to be handed out.
    Shareable,
    /// Under a node's data directory (`strata dev --secure`): the directory mode 700 and
    /// every file mode 600, as everything else there.
    OwnerOnly,
}

/// Writes a secret file readable by its owner only (mode 600).
pub(crate) fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = strata_core::private_fs::create(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes a certificate: private under a data directory, as the umask allows otherwise.
fn write_cert(path: &Path, pem: &str, files: CertFiles) -> anyhow::Result<()> {
    match files {
        CertFiles::OwnerOnly => write_private(path, pem),
        CertFiles::Shareable => {
            std::fs::write(path, pem).with_context(|| format!("writing {}", path.display()))
        }
    }
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = std::time::SystemTime::now();
    params.not_before = (now - std::time::Duration::from_secs(3600)).into();
    params.not_after = (now + std::time::Duration::from_secs(u64::from(days) * 86_400)).into();
}

/// The CA in `dir`, made when absent.
fn ca(dir: &Path, days: u32, files: CertFiles) -> anyhow::Result<Issuer<'static, KeyPair>> {
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    if cert.exists() {
        let key = KeyPair::from_pem(
            &std::fs::read_to_string(&key).with_context(|| format!("reading {}", key.display()))?,
        )
        .with_context(|| format!("parsing {}", key.display()))?;
        let pem = std::fs::read_to_string(&cert)
            .with_context(|| format!("reading {}", cert.display()))?;
        return Issuer::from_ca_cert_pem(&pem, key)
            .with_context(|| format!("parsing {}", cert.display()));
    }
    let key_pair = KeyPair::generate().context("generating the CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "Strata development CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, days.max(3650));
    let ca_cert = params.self_signed(&key_pair).context("signing the CA")?;
    write_cert(&cert, &ca_cert.pem(), files)?;
    write_private(&key, &key_pair.serialize_pem())?;
    println!("wrote {} and {}", cert.display(), key.display());
    Ok(Issuer::new(params, key_pair))
}

/// Issues `<args.out>/<file>.pem` and `.key` for `cn`.
fn issue(
    args: &CertsArgs,
    files: CertFiles,
    file: &str,
    cn: &str,
    sans: Vec<String>,
    usages: Vec<ExtendedKeyUsagePurpose>,
    issuer: &Issuer<'_, KeyPair>,
) -> anyhow::Result<()> {
    let key_pair = KeyPair::generate().context("generating a key")?;
    let mut params = CertificateParams::new(sans).context("invalid host name")?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = usages;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    validity(&mut params, args.days);
    let cert = params
        .signed_by(&key_pair, issuer)
        .with_context(|| format!("signing the certificate of {cn}"))?;
    let (cert_path, key_path) = (
        args.out.join(format!("{file}.pem")),
        args.out.join(format!("{file}.key")),
    );
    write_cert(&cert_path, &cert.pem(), files)?;
    write_private(&key_path, &key_pair.serialize_pem())?;
    println!("wrote {} and {}", cert_path.display(), key_path.display());
    Ok(())
}

pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    make(&args, CertFiles::Shareable)
}

/// Makes the CA (unless there is one in `args.out`) and the certificates asked for.
pub fn make(args: &CertsArgs, files: CertFiles) -> anyhow::Result<()> {
    if args.nodes.is_empty() && args.clients.is_empty() {
        bail!("nothing to make: give --node NAME and/or --client NAME");
    }
    if args.days == 0 {
        bail!("--days must be at least 1");
    }
    match files {
        CertFiles::OwnerOnly => strata_core::private_fs::create_dir_all(&args.out),
        CertFiles::Shareable => std::fs::create_dir_all(&args.out),
    }
    .with_context(|| format!("making {}", args.out.display()))?;
    let issuer = ca(&args.out, args.days, files)?;
    for node in &args.nodes {
        issue(
            args,
            files,
            &format!("node-{node}"),
            node,
            args.hosts.clone(),
            // nodes are servers, and clients of each other
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            &issuer,
        )?;
    }
    for client in &args.clients {
        issue(
            args,
            files,
            &format!("client-{client}"),
            client,
            Vec::new(),
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &issuer,
        )?;
    }
    Ok(())
}
