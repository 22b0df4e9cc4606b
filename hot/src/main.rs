//! `strata`: run a broker (`dev`, `server`) or administer topics (`topic`) and consumer
//! groups (`group`).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use strata_hot::cli;
use strata_hot::config::{DevFlags, ServerConfig};

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Strata: a replicated log with tiered storage, Kafka-compatible"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// CA certificate (PEM) of a cluster whose gRPC ports use mTLS ([tls]); the admin and
    /// native-client commands then connect over TLS. Also STRATA_TLS_CA.
    #[arg(long, global = true)]
    tls_ca: Option<PathBuf>,
    /// This client's certificate (PEM), whose subject is its principal. Also STRATA_TLS_CERT.
    #[arg(long, global = true, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// This client's private key (PEM, mode 600). Also STRATA_TLS_KEY.
    #[arg(long, global = true)]
    tls_key: Option<PathBuf>,
    /// A file whose first line is a bearer token (a JWT from the identity provider the
    /// brokers trust for OAUTHBEARER), sent with every gRPC call of produce / consume.
    /// Mode 600. Also STRATA_TOKEN_FILE.
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
    /// Log lines as text, or as JSON objects for a log shipper. Also STRATA_LOG_FORMAT.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "STRATA_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: strata_hot::logging::LogFormat,
}

/// The bearer token of the native-client commands, from --token-file or the environment.
fn client_token(args: &Args) -> anyhow::Result<()> {
    let Some(path) = args
        .token_file
        .clone()
        .or_else(|| std::env::var_os("STRATA_TOKEN_FILE").map(PathBuf::from))
    else {
        return Ok(());
    };
    strata_hot::kafka::tls::check_private(&path)?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the token in {}", path.display()))?;
    let token = text.lines().next().unwrap_or_default().trim();
    anyhow::ensure!(
        !token.is_empty(),
        "{} holds no token on its first line",
        path.display()
    );
    strata_client::use_grpc_token(token).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The mTLS settings of the client commands, from the flags or the environment.
fn client_tls(args: &Args) -> anyhow::Result<()> {
    let from_env = |flag: &Option<PathBuf>, var: &str| {
        flag.clone()
            .or_else(|| std::env::var_os(var).map(PathBuf::from))
    };
    let ca = from_env(&args.tls_ca, "STRATA_TLS_CA");
    let cert = from_env(&args.tls_cert, "STRATA_TLS_CERT");
    let key = from_env(&args.tls_key, "STRATA_TLS_KEY");
    let Some(ca) = ca else {
        if cert.is_some() || key.is_some() {
            anyhow::bail!("--tls-cert and --tls-key need --tls-ca (the cluster's CA certificate)");
        }
        return Ok(());
    };
    let pair = match (&cert, &key) {
        (Some(c), Some(k)) => {
            strata_hot::kafka::tls::check_private(k)?;
            Some((c.as_path(), k.as_path()))
        }
        (None, None) => None,
        _ => anyhow::bail!("give both --tls-cert and --tls-key, or neither"),
    };
    let tls = strata_proto::tls::GrpcTls::load(&ca, pair).context("client TLS")?;
    strata_client::use_grpc_tls(tls);
    Ok(())
}

#[derive(Subcommand)]
enum Command {
    /// Run an embedded single-node cluster for development: one process with the controller
    /// and broker roles (data in ./strata-data).
    Dev {
        /// Data directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Kafka listener address.
        #[arg(long)]
        listen: Option<String>,
        /// gRPC data-plane address (default 127.0.0.1:9095 when the Kafka listener is the
        /// default 127.0.0.1:9092; otherwise off unless given).
        #[arg(long)]
        grpc: Option<String>,
        /// The embedded controller's gRPC address (default 127.0.0.1:9093).
        #[arg(long)]
        controller_listen: Option<String>,
        /// Prometheus endpoint address (default 127.0.0.1:9096 with the default listener).
        #[arg(long)]
        metrics: Option<String>,
        /// Optional config file (see strata.example.toml); flags override it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Lock it down: Kafka over SASL_SSL with SCRAM, mTLS on the gRPC ports, ACLs closed
        /// by default; certificates and an admin password are made under the data directory.
        #[arg(long)]
        secure: bool,
    },
    /// Run a broker from a config file.
    Server {
        #[arg(long)]
        config: PathBuf,
    },
    /// Check a config file as `strata server` would read it.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Create, list, describe and delete topics.
    Topic {
        /// A broker's Kafka listener.
        #[arg(long, default_value = "127.0.0.1:9092", global = true)]
        bootstrap: String,
        /// Talk to a controller's gRPC listener instead of a broker (cluster mode).
        #[arg(long, global = true)]
        controller: Option<String>,
        #[command(subcommand)]
        command: cli::TopicCommand,
    },
    /// List, describe and reset consumer groups.
    Group {
        /// A broker's Kafka listener.
        #[arg(long, default_value = "127.0.0.1:9092", global = true)]
        bootstrap: String,
        #[command(subcommand)]
        command: cli::GroupCommand,
    },
    /// Produce lines from stdin through the gRPC data plane (the native Rust producer).
    Produce(cli::ProduceArgs),
    /// Print a topic's records through the gRPC data plane (the native Rust consumer).
    Consume(cli::ConsumeArgs),
    /// Make a development CA and node / client certificates (for TLS listeners).
    Certs(strata_hot::certs::CertsArgs),
    /// Create, list and delete SCRAM users (credentials live in the metadata log).
    User {
        /// Any controller's gRPC listener.
        #[arg(long, default_value = "127.0.0.1:9093", global = true)]
        controller: String,
        #[command(subcommand)]
        command: cli::UserCommand,
    },
    /// Add, remove and list ACLs (kafka-acls.sh's vocabulary; rules live in the metadata log).
    Acl {
        /// Any controller's gRPC listener.
        #[arg(long, default_value = "127.0.0.1:9093", global = true)]
        controller: String,
        #[command(subcommand)]
        command: cli::AclCommand,
    },
    /// Set, remove and describe client quotas (kafka-configs.sh's vocabulary; quotas live
    /// in the metadata log).
    Quota {
        /// Any controller's gRPC listener.
        #[arg(long, default_value = "127.0.0.1:9093", global = true)]
        controller: String,
        #[command(subcommand)]
        command: cli::QuotaCommand,
    },
    /// Inspect the controller quorum.
    Quorum {
        /// Any controller's gRPC listener.
        #[arg(long, default_value = "127.0.0.1:9093", global = true)]
        controller: String,
        #[command(subcommand)]
        command: cli::QuorumCommand,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate FILE with the STRATA__* variables applied, and print the effective
    /// configuration (every default filled in) as TOML; exits non-zero on the first error.
    Check { file: PathBuf },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    strata_hot::logging::init(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let env = std::env::vars();
    client_tls(&args)?;
    client_token(&args)?;
    match args.command {
        Command::Dev {
            data_dir,
            listen,
            grpc,
            controller_listen,
            metrics,
            config,
            secure,
        } => {
            let flags = DevFlags {
                data_dir,
                listen,
                grpc,
                controller_listen,
                metrics,
            };
            let mut config = ServerConfig::dev(config.as_deref(), flags, env)?;
            if secure {
                let secured = strata_hot::secure_dev::secure(&mut config)?;
                println!("{}", secured.instructions(&config));
            }
            runtime.block_on(strata_hot::server::run(config))
        }
        Command::Server { config } => {
            let config = ServerConfig::load(Some(&config), env)?;
            runtime.block_on(strata_hot::server::run(config))
        }
        Command::Config {
            command: ConfigCommand::Check { file },
        } => {
            let config = ServerConfig::load(Some(&file), env)?;
            println!(
                "# {} is valid. The effective configuration, defaults filled in and STRATA__* variables applied:\n",
                file.display()
            );
            print!("{}", config.effective_toml()?);
            Ok(())
        }
        Command::Topic {
            bootstrap,
            controller: Some(controller),
            command,
        } => {
            let _ = bootstrap;
            runtime.block_on(cli::topic_via_controller(&controller, command))
        }
        Command::Topic {
            bootstrap,
            controller: None,
            command,
        } => runtime.block_on(cli::topic(&bootstrap, command)),
        Command::Quorum {
            controller,
            command,
        } => runtime.block_on(cli::quorum(&controller, command)),
        Command::Certs(args) => strata_hot::certs::run(args),
        Command::Acl {
            controller,
            command,
        } => runtime.block_on(cli::acl(&controller, command)),
        Command::User {
            controller,
            command,
        } => runtime.block_on(cli::user(&controller, command)),
        Command::Quota {
            controller,
            command,
        } => runtime.block_on(cli::quota(&controller, command)),
        Command::Group { bootstrap, command } => runtime.block_on(cli::group(&bootstrap, command)),
        Command::Produce(args) => runtime.block_on(cli::produce(args)),
        Command::Consume(args) => runtime.block_on(cli::consume(args)),
    }
}
