//! The `strata topic` admin commands, spoken over the Kafka protocol to any broker.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use clap::Subcommand;
use strata_client::controller::ControllerAdmin;
use strata_client::Admin;

#[derive(Subcommand)]
pub enum TopicCommand {
    /// Create a topic (a no-op when it exists with the same spec).
    Create {
        name: String,
        #[arg(long, short)]
        partitions: Option<i32>,
        #[arg(long)]
        replication_factor: Option<i16>,
        /// A topic config under Kafka's name, e.g. --config retention.ms=86400000 (repeatable).
        #[arg(long = "config", short = 'c', value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// List topics.
    List,
    /// Show a topic's partitions and configs.
    Describe { name: String },
    /// Delete a topic and its data.
    Delete { name: String },
    /// Elect leaders (Kafka's kafka-leader-election.sh): by default each partition's
    /// preferred (first) replica leads again where it is alive and in the ISR. Needs
    /// --controller.
    ElectLeaders {
        /// The topic (every partition of it unless --partition); none: every topic.
        topic: Option<String>,
        /// Only these partitions of the topic (repeatable).
        #[arg(long = "partition", requires = "topic")]
        partitions: Vec<u32>,
        /// Unclean election: a partition without a leader takes any live replica, even
        /// one that may lack acknowledged records (they are then lost). Refused for a
        /// partition that has a leader.
        #[arg(long)]
        unclean: bool,
    },
    /// Move partitions to other brokers (Kafka's kafka-reassign-partitions.sh): the new
    /// replicas copy from the leader, join the ISR once caught up, and then the old ones
    /// leave and delete their copies. Needs --controller.
    Reassign {
        topic: String,
        /// The partitions to move (repeatable); none: every partition of the topic.
        #[arg(long = "partition")]
        partitions: Vec<u32>,
        /// The target replicas by broker id, the first preferred to lead, e.g. 2,3.
        #[arg(long, value_delimiter = ',', required_unless_present = "cancel")]
        replicas: Vec<i32>,
        /// Cancel the moves in progress: back to the replicas they had before.
        #[arg(long, conflicts_with = "replicas")]
        cancel: bool,
        /// Bytes per second each new replica may copy at (e.g. 10485760); default:
        /// unthrottled.
        #[arg(long)]
        throttle: Option<u64>,
        /// Wait until the moves are done, with a progress bar.
        #[arg(long)]
        wait: bool,
    },
}

fn parse_configs(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => bail!("--config '{p}' is not KEY=VALUE"),
        })
        .collect()
}

pub async fn topic(bootstrap: &str, command: TopicCommand) -> anyhow::Result<()> {
    let mut admin = Admin::connect(bootstrap)
        .await
        .with_context(|| format!("connecting to {bootstrap} (is `strata dev` running?)"))?;
    match command {
        TopicCommand::Create {
            name,
            partitions,
            replication_factor,
            configs,
        } => {
            let configs = parse_configs(&configs)?;
            admin
                .create_topic(&name, partitions, replication_factor, &configs)
                .await
                .with_context(|| format!("creating topic '{name}'"))?;
            println!("created topic {name}");
        }
        TopicCommand::List => {
            for t in admin.list_topics(&[]).await.context("listing topics")? {
                println!(
                    "{}\tpartitions={}\treplication={}",
                    t.name, t.partitions, t.replication_factor
                );
            }
        }
        TopicCommand::Describe { name } => {
            let info = admin
                .list_topics(&[&name])
                .await
                .with_context(|| format!("describing topic '{name}'"))?;
            let t = info.first().context("the broker returned no topic")?;
            println!(
                "topic {}\nid {}\npartitions {}\nreplication factor {}",
                t.name, t.id, t.partitions, t.replication_factor
            );
            let ids = |v: &[i32]| v.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
            for p in &t.layout {
                let leader = p
                    .leader
                    .map_or("none (offline)".to_string(), |l| l.to_string());
                let note = if p.leader.is_none() {
                    "\toffline"
                } else if p.isr.len() < p.replicas.len() {
                    "\tunder-replicated"
                } else {
                    ""
                };
                println!(
                    "  partition {}\tleader {leader}\tepoch {}\treplicas {}\tisr {}{note}",
                    p.index,
                    p.leader_epoch,
                    ids(&p.replicas),
                    ids(&p.isr)
                );
            }
            for c in admin
                .describe_configs(&name)
                .await
                .context("describing configs")?
            {
                println!("  {} = {} ({})", c.name, c.value, c.source);
            }
        }
        TopicCommand::Delete { name } => {
            admin
                .delete_topic(&name)
                .await
                .with_context(|| format!("deleting topic '{name}'"))?;
            println!("deleted topic {name}");
        }
        TopicCommand::ElectLeaders { .. } => {
            bail!("elect-leaders is decided by the controllers: give --controller HOST:PORT")
        }
        TopicCommand::Reassign { .. } => {
            bail!("reassign is decided by the controllers: give --controller HOST:PORT")
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a user, or set its password: SCRAM keys are derived here, and only they are
    /// sent (the password never leaves this process).
    Create {
        name: String,
        /// A file whose first line is the password.
        #[arg(long, conflicts_with = "password_env")]
        password_file: Option<std::path::PathBuf>,
        /// An environment variable holding the password.
        #[arg(long)]
        password_env: Option<String>,
        /// SCRAM-SHA-256 or SCRAM-SHA-512 (repeatable; default both).
        #[arg(long = "mechanism")]
        mechanisms: Vec<String>,
        /// PBKDF2 iterations (4096 to 16384).
        #[arg(long, default_value_t = crate::kafka::sasl::scram::DEFAULT_ITERATIONS)]
        iterations: u32,
    },
    /// Delete a user's credentials (all mechanisms unless given).
    Delete {
        name: String,
        #[arg(long = "mechanism")]
        mechanisms: Vec<String>,
    },
    /// List users, their mechanisms and iterations.
    List,
}

fn scram_mechanisms(
    names: &[String],
) -> anyhow::Result<Vec<strata_controller::metadata::ScramMechanism>> {
    use strata_controller::metadata::ScramMechanism;
    if names.is_empty() {
        return Ok(ScramMechanism::ALL.to_vec());
    }
    names
        .iter()
        .map(|n| {
            ScramMechanism::from_name(n).with_context(|| {
                format!("unknown mechanism '{n}': use SCRAM-SHA-256 or SCRAM-SHA-512")
            })
        })
        .collect()
}

fn read_password(file: Option<&std::path::Path>, env: Option<&str>) -> anyhow::Result<String> {
    let password = match (file, env) {
        (Some(f), _) => {
            crate::kafka::tls::check_private(f)?;
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("reading the password file {}", f.display()))?;
            text.lines().next().unwrap_or_default().to_string()
        }
        (None, Some(var)) => std::env::var(var)
            .with_context(|| format!("reading the password from ${var} (is it set?)"))?,
        (None, None) => bail!("give the password with --password-file FILE or --password-env VAR"),
    };
    if password.is_empty() {
        bail!("the password is empty");
    }
    Ok(password)
}

pub async fn user(controller: &str, command: UserCommand) -> anyhow::Result<()> {
    use crate::kafka::sasl::scram;
    use strata_proto::v1::{ScramDeletion, ScramUpsertion};
    let mut admin = controller_admin(controller).await?;
    match command {
        UserCommand::Create {
            name,
            password_file,
            password_env,
            mechanisms,
            iterations,
        } => {
            let password = read_password(password_file.as_deref(), password_env.as_deref())?;
            let upsertions = scram_mechanisms(&mechanisms)?
                .into_iter()
                .map(|m| {
                    let c =
                        scram::derive(m, password.as_bytes(), &scram::random_bytes(32), iterations);
                    ScramUpsertion {
                        user: name.clone(),
                        mechanism: m.name().to_string(),
                        salt: c.salt,
                        iterations: c.iterations,
                        stored_key: c.stored_key,
                        server_key: c.server_key,
                    }
                })
                .collect();
            admin
                .alter_scram_credentials(upsertions, Vec::new())
                .await
                .with_context(|| format!("setting the credentials of user '{name}'"))?;
            println!("user {name}: credentials set");
        }
        UserCommand::Delete { name, mechanisms } => {
            let known: Vec<String> = admin
                .describe_scram_credentials()
                .await
                .context("listing users")?
                .into_iter()
                .filter(|c| c.user == name)
                .map(|c| c.mechanism)
                .collect();
            // without --mechanism, every mechanism the user has
            let deletions: Vec<ScramDeletion> = scram_mechanisms(&mechanisms)?
                .into_iter()
                .map(|m| m.name().to_string())
                .filter(|m| !mechanisms.is_empty() || known.contains(m))
                .map(|mechanism| ScramDeletion {
                    user: name.clone(),
                    mechanism,
                })
                .collect();
            if deletions.is_empty() {
                bail!("user '{name}' has no credentials");
            }
            admin
                .alter_scram_credentials(Vec::new(), deletions)
                .await
                .with_context(|| format!("deleting the credentials of user '{name}'"))?;
            println!("user {name}: credentials deleted");
        }
        UserCommand::List => {
            for c in admin
                .describe_scram_credentials()
                .await
                .context("listing users")?
            {
                println!("{}\t{}\titerations={}", c.user, c.mechanism, c.iterations);
            }
        }
    }
    Ok(())
}

/// Which resources an `acl` command names (kafka-acls.sh's flags).
#[derive(clap::Args, Clone)]
pub struct AclResources {
    /// A topic (repeatable); `*` for every topic.
    #[arg(long = "topic")]
    pub topics: Vec<String>,
    /// A consumer group (repeatable); `*` for every group.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// The cluster itself (create topics, ACLs, idempotent writes).
    #[arg(long)]
    pub cluster: bool,
    /// A transactional id (repeatable).
    #[arg(long = "transactional-id")]
    pub transactional_ids: Vec<String>,
    /// literal (the default) or prefixed.
    #[arg(long, default_value = "literal")]
    pub resource_pattern_type: String,
}

/// Who and what an `acl add` or `acl remove` names.
#[derive(clap::Args, Clone)]
pub struct AclWho {
    #[arg(long = "allow-principal")]
    pub allow_principals: Vec<String>,
    #[arg(long = "deny-principal")]
    pub deny_principals: Vec<String>,
    /// The client address the rule applies to (default every host).
    #[arg(long, default_value = "*")]
    pub host: String,
    /// Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs,
    /// AlterConfigs, IdempotentWrite or All (repeatable).
    #[arg(long = "operation")]
    pub operations: Vec<String>,
}

#[derive(Subcommand)]
pub enum AclCommand {
    /// Add rules: each principal x operation x resource.
    Add {
        #[command(flatten)]
        resources: AclResources,
        #[command(flatten)]
        who: AclWho,
    },
    /// Remove the rules matching the given resources, principals and operations (all of a
    /// resource's rules when no principal or operation is given).
    Remove {
        #[command(flatten)]
        resources: AclResources,
        #[command(flatten)]
        who: AclWho,
    },
    /// List rules, optionally of one principal or resource.
    List {
        #[arg(long)]
        principal: Option<String>,
        #[arg(long)]
        topic: Option<String>,
        #[arg(long)]
        group: Option<String>,
    },
}

fn acl_operation(name: &str) -> anyhow::Result<strata_controller::metadata::acl::Operation> {
    use strata_controller::metadata::acl::Operation;
    Operation::EVERY
        .into_iter()
        .find(|o| format!("{o:?}").eq_ignore_ascii_case(name))
        .with_context(|| {
            format!("unknown operation '{name}' (Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All)")
        })
}

fn acl_resources(
    r: &AclResources,
) -> anyhow::Result<
    Vec<(
        strata_controller::metadata::acl::ResourceType,
        String,
        strata_controller::metadata::acl::PatternType,
    )>,
> {
    use strata_controller::metadata::acl::{PatternType, ResourceType, CLUSTER_NAME};
    let pattern = match r.resource_pattern_type.to_ascii_lowercase().as_str() {
        "literal" => PatternType::Literal,
        "prefixed" => PatternType::Prefixed,
        other => bail!("--resource-pattern-type must be literal or prefixed, not '{other}'"),
    };
    let mut out = Vec::new();
    out.extend(
        r.topics
            .iter()
            .map(|t| (ResourceType::Topic, t.clone(), pattern)),
    );
    out.extend(
        r.groups
            .iter()
            .map(|g| (ResourceType::Group, g.clone(), pattern)),
    );
    out.extend(
        r.transactional_ids
            .iter()
            .map(|t| (ResourceType::TransactionalId, t.clone(), pattern)),
    );
    if r.cluster {
        out.push((
            ResourceType::Cluster,
            CLUSTER_NAME.to_string(),
            PatternType::Literal,
        ));
    }
    if out.is_empty() {
        bail!("name a resource: --topic, --group, --cluster or --transactional-id");
    }
    Ok(out)
}

pub async fn acl(controller: &str, command: AclCommand) -> anyhow::Result<()> {
    use strata_controller::metadata::acl::{AclBinding, AclFilter, Permission};
    let mut admin = controller_admin(controller).await?;
    match command {
        AclCommand::Add { resources, who } => {
            let operations = who
                .operations
                .iter()
                .map(|o| acl_operation(o))
                .collect::<anyhow::Result<Vec<_>>>()?;
            if operations.is_empty() {
                bail!("name at least one --operation");
            }
            let principals: Vec<(String, Permission)> = who
                .allow_principals
                .iter()
                .map(|p| (p.clone(), Permission::Allow))
                .chain(
                    who.deny_principals
                        .iter()
                        .map(|p| (p.clone(), Permission::Deny)),
                )
                .collect();
            if principals.is_empty() {
                bail!("name at least one --allow-principal or --deny-principal (e.g. User:alice)");
            }
            let mut bindings = Vec::new();
            for (resource_type, name, pattern) in acl_resources(&resources)? {
                for (principal, permission) in &principals {
                    for operation in &operations {
                        let b = AclBinding {
                            resource_type,
                            name: name.clone(),
                            pattern,
                            principal: principal.clone(),
                            host: who.host.clone(),
                            operation: *operation,
                            permission: *permission,
                        };
                        b.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
                        bindings.push(b);
                    }
                }
            }
            admin
                .create_acls_json(serde_json::to_vec(&bindings)?)
                .await
                .context("adding ACLs")?;
            println!("added {} ACL(s)", bindings.len());
        }
        AclCommand::Remove { resources, who } => {
            let operations = who
                .operations
                .iter()
                .map(|o| acl_operation(o).map(Some))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let operations = if operations.is_empty() {
                vec![None]
            } else {
                operations
            };
            let principals: Vec<(Option<String>, Option<Permission>)> = who
                .allow_principals
                .iter()
                .map(|p| (Some(p.clone()), Some(Permission::Allow)))
                .chain(
                    who.deny_principals
                        .iter()
                        .map(|p| (Some(p.clone()), Some(Permission::Deny))),
                )
                .collect();
            let principals = if principals.is_empty() {
                vec![(None, None)]
            } else {
                principals
            };
            let mut filters = Vec::new();
            for (resource_type, name, pattern) in acl_resources(&resources)? {
                for (principal, permission) in &principals {
                    for operation in &operations {
                        filters.push(AclFilter {
                            resource_type: Some(resource_type),
                            name: Some(name.clone()),
                            pattern: Some(pattern),
                            principal: principal.clone(),
                            host: (who.host != "*").then(|| who.host.clone()),
                            operation: *operation,
                            permission: *permission,
                            matching: false,
                        });
                    }
                }
            }
            let deleted = admin
                .delete_acls_json(serde_json::to_vec(&filters)?)
                .await
                .context("removing ACLs")?;
            let deleted: Vec<AclBinding> =
                serde_json::from_slice(&deleted).context("decoding the removed ACLs")?;
            println!("removed {} ACL(s)", deleted.len());
        }
        AclCommand::List {
            principal,
            topic,
            group,
        } => {
            let metadata = cluster_metadata(&mut admin).await?;
            for a in metadata.acls.iter().filter(|a| {
                principal.as_ref().is_none_or(|p| *p == a.principal)
                    && topic.as_ref().is_none_or(|t| {
                        a.resource_type == strata_controller::metadata::acl::ResourceType::Topic
                            && *t == a.name
                    })
                    && group.as_ref().is_none_or(|g| {
                        a.resource_type == strata_controller::metadata::acl::ResourceType::Group
                            && *g == a.name
                    })
            }) {
                println!(
                    "{}\t{:?}\t{:?}\t{:?}:{} ({:?})\thost={}",
                    a.principal,
                    a.permission,
                    a.operation,
                    a.resource_type,
                    a.name,
                    a.pattern,
                    a.host
                );
            }
        }
    }
    Ok(())
}

/// Whose quota a `quota` command names: a user, a client id, or a user's client id, each
/// by name or as the default (`--user-default`, `--client-default`).
#[derive(clap::Args, Clone)]
pub struct QuotaWho {
    #[arg(long, conflicts_with = "user_default")]
    pub user: Option<String>,
    #[arg(long)]
    pub user_default: bool,
    #[arg(long, conflicts_with = "client_default")]
    pub client_id: Option<String>,
    #[arg(long)]
    pub client_default: bool,
}

impl QuotaWho {
    fn entity(&self) -> strata_controller::metadata::quota::QuotaEntity {
        use strata_controller::metadata::quota::EntityName;
        let part = |name: &Option<String>, default: bool| match (name, default) {
            (Some(n), _) => Some(EntityName::Named(n.clone())),
            (None, true) => Some(EntityName::Default),
            (None, false) => None,
        };
        strata_controller::metadata::quota::QuotaEntity {
            user: part(&self.user, self.user_default),
            client_id: part(&self.client_id, self.client_default),
        }
    }
}

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Set and remove quotas of one entity, e.g. `--user order-service --add-config
    /// producer_byte_rate=1048576` (producer_byte_rate and consumer_byte_rate in bytes per
    /// second, request_percentage in percent of one request thread).
    Alter {
        #[command(flatten)]
        who: QuotaWho,
        /// key=value pairs, comma-separated (repeatable).
        #[arg(long = "add-config", value_delimiter = ',')]
        add: Vec<String>,
        /// Keys to remove, comma-separated (repeatable).
        #[arg(long = "delete-config", value_delimiter = ',')]
        delete: Vec<String>,
    },
    /// Print every quota (one line per entity), or those naming the given user or client id.
    Describe {
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        client_id: Option<String>,
    },
}

pub async fn quota(controller: &str, command: QuotaCommand) -> anyhow::Result<()> {
    use strata_controller::metadata::quota::{EntityName, QuotaAlteration, QuotaKey, QuotaValue};
    let mut admin = controller_admin(controller).await?;
    match command {
        QuotaCommand::Alter { who, add, delete } => {
            let entity = who.entity();
            let mut a = QuotaAlteration {
                entity: entity.clone(),
                set: Default::default(),
                remove: Vec::new(),
            };
            for pair in &add {
                let (k, v) = pair
                    .split_once('=')
                    .with_context(|| format!("--add-config '{pair}' is not key=value"))?;
                let value: f64 = v
                    .parse()
                    .with_context(|| format!("quota '{k}': '{v}' is not a number"))?;
                a.set.insert(
                    QuotaKey::from_name(k).map_err(anyhow::Error::msg)?,
                    QuotaValue::new(value).map_err(anyhow::Error::msg)?,
                );
            }
            for k in &delete {
                a.remove
                    .push(QuotaKey::from_name(k).map_err(anyhow::Error::msg)?);
            }
            anyhow::ensure!(
                !a.set.is_empty() || !a.remove.is_empty(),
                "nothing to change: give --add-config or --delete-config"
            );
            a.validate().map_err(anyhow::Error::msg)?;
            admin
                .alter_client_quotas_json(serde_json::to_vec(&[a])?)
                .await
                .context("altering client quotas")?;
            println!("altered the quotas of {entity}");
        }
        QuotaCommand::Describe { user, client_id } => {
            let metadata = cluster_metadata(&mut admin).await?;
            let names = |part: &Option<EntityName>, want: &Option<String>| {
                want.as_ref()
                    .is_none_or(|w| matches!(part, Some(EntityName::Named(n)) if n == w))
            };
            for (entity, values) in metadata
                .client_quotas
                .iter()
                .filter(|(e, _)| names(&e.user, &user) && names(&e.client_id, &client_id))
            {
                let values: Vec<String> = values
                    .iter()
                    .map(|(k, v)| format!("{}={}", k.name(), v.get()))
                    .collect();
                println!("{entity}\t{}", values.join(","));
            }
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum QuorumCommand {
    /// Print the quorum as this controller sees it (one JSON line).
    Describe,
    /// Print the cluster metadata (JSON).
    Metadata,
}

/// Says on stderr when the controller that answered may be cut off from the quorum.
fn warn_if_stale(controller: &str, snapshot: &strata_proto::v1::MetadataSnapshot) {
    if !snapshot.possibly_stale {
        return;
    }
    let why = match snapshot.quorum_contact_age_ms {
        Some(ms) => format!("has not been in touch with the controller quorum for {ms} ms"),
        None => "knows no controller leader".to_string(),
    };
    eprintln!(
        "warning: the controller at {controller} {why}: this metadata (version {}) may be \
         behind the cluster's; ask another controller",
        snapshot.version
    );
}

/// The cluster metadata as the controller asked holds it.
async fn cluster_metadata(
    admin: &mut ControllerAdmin,
) -> anyhow::Result<strata_controller::metadata::ClusterMetadata> {
    let (_, json) = admin
        .metadata_json()
        .await
        .context("reading the cluster metadata")?;
    serde_json::from_slice(&json).context("decoding the cluster metadata")
}

async fn controller_admin(addr: &str) -> anyhow::Result<ControllerAdmin> {
    ControllerAdmin::connect(addr)
        .await
        .with_context(|| format!("connecting to the controller at {addr}"))
}

pub async fn quorum(controller: &str, command: QuorumCommand) -> anyhow::Result<()> {
    let mut admin = controller_admin(controller).await?;
    match command {
        QuorumCommand::Describe => {
            let q = admin
                .describe_quorum()
                .await
                .context("describing the quorum")?;
            println!(
                "{}",
                serde_json::json!({
                    "node_id": q.node_id,
                    "leader_id": q.leader_id,
                    "term": q.term,
                    "last_applied": q.last_applied,
                    "voters": q.voters,
                })
            );
        }
        QuorumCommand::Metadata => {
            let snapshot = admin
                .metadata_snapshot()
                .await
                .context("reading the cluster metadata")?;
            warn_if_stale(controller, &snapshot);
            let json = snapshot.metadata_json;
            let mut metadata: serde_json::Value =
                serde_json::from_slice(&json).context("decoding the cluster metadata")?;
            // SCRAM keys are secrets: users and mechanisms only.
            if let Some(users) = metadata
                .get_mut("scram_credentials")
                .and_then(|c| c.as_object_mut())
            {
                for mechanisms in users.values_mut() {
                    if let Some(m) = mechanisms.as_object_mut() {
                        for v in m.values_mut() {
                            *v = serde_json::json!("<redacted>");
                        }
                    }
                }
            }
            println!("{metadata}");
        }
    }
    Ok(())
}

/// Topic administration through the controller quorum.
pub async fn topic_via_controller(controller: &str, command: TopicCommand) -> anyhow::Result<()> {
    let mut admin = controller_admin(controller).await?;
    match command {
        TopicCommand::Create {
            name,
            partitions,
            replication_factor,
            configs,
        } => {
            let configs = parse_configs(&configs)?;
            let partitions =
                u32::try_from(partitions.unwrap_or(1)).context("--partitions must be positive")?;
            let rf = u32::try_from(replication_factor.unwrap_or(1))
                .context("--replication-factor must be positive")?;
            let (id, created) = admin
                .create_topic(&name, partitions, rf, &configs)
                .await
                .with_context(|| format!("creating topic '{name}'"))?;
            if created {
                println!("created topic {name} ({id})");
            } else {
                println!("topic {name} already exists with this spec ({id})");
            }
        }
        TopicCommand::Delete { name } => {
            admin
                .delete_topic(&name)
                .await
                .with_context(|| format!("deleting topic '{name}'"))?;
            println!("deleted topic {name}");
        }
        TopicCommand::ElectLeaders {
            topic,
            partitions,
            unclean,
        } => {
            let asked = match topic {
                None => None,
                Some(topic) => {
                    let partitions = if partitions.is_empty() {
                        let snapshot = admin
                            .metadata_snapshot()
                            .await
                            .context("reading the cluster metadata")?;
                        let metadata: serde_json::Value =
                            serde_json::from_slice(&snapshot.metadata_json)
                                .context("decoding the cluster metadata")?;
                        let count = metadata["topics"][&topic]["partitions"]
                            .as_array()
                            .with_context(|| format!("topic '{topic}' does not exist"))?
                            .len() as u32;
                        (0..count).collect()
                    } else {
                        partitions
                    };
                    Some(partitions.into_iter().map(|p| (topic.clone(), p)).collect())
                }
            };
            let results = admin
                .elect_leaders(unclean, asked)
                .await
                .context("electing leaders")?;
            let mut failed = 0;
            for r in &results {
                match r.error_code {
                    0 => println!("{}-{}	elected broker {}", r.topic, r.partition, r.leader),
                    84 => println!("{}-{}	unchanged: {}", r.topic, r.partition, r.message),
                    _ => {
                        failed += 1;
                        println!("{}-{}	not elected: {}", r.topic, r.partition, r.message);
                    }
                }
            }
            if results.is_empty() {
                println!("no partition needed an election");
            }
            if failed > 0 {
                bail!(
                    "{failed} of {} partitions could not be elected",
                    results.len()
                );
            }
        }
        TopicCommand::Reassign {
            topic,
            partitions,
            replicas,
            cancel,
            throttle,
            wait,
        } => {
            let metadata = metadata_json(&mut admin).await?;
            let partitions = if partitions.is_empty() {
                let count = metadata["topics"][&topic]["partitions"]
                    .as_array()
                    .with_context(|| format!("topic '{topic}' does not exist"))?
                    .len() as u32;
                (0..count).collect()
            } else {
                partitions
            };
            let moves = partitions
                .iter()
                .map(|p| strata_proto::v1::PartitionMove {
                    topic: topic.clone(),
                    partition: *p,
                    replicas: replicas.clone(),
                    cancel,
                    throttle_bytes_per_second: throttle.unwrap_or(0),
                })
                .collect();
            let results = admin
                .reassign_partitions(moves)
                .await
                .context("reassigning partitions")?;
            let mut failed = 0;
            for r in &results {
                if r.error_code == 0 {
                    let what = if cancel { "cancelled" } else { "moving" };
                    println!("{}-{}\t{what}", r.topic, r.partition);
                } else {
                    failed += 1;
                    println!("{}-{}\trefused: {}", r.topic, r.partition, r.message);
                }
            }
            if failed > 0 {
                bail!(
                    "{failed} of {} partitions could not be reassigned",
                    results.len()
                );
            }
            if wait {
                wait_for_moves(&mut admin, &topic, &partitions).await?;
            }
        }
        TopicCommand::List | TopicCommand::Describe { .. } => {
            let snapshot = admin
                .metadata_snapshot()
                .await
                .context("reading the cluster metadata")?;
            warn_if_stale(controller, &snapshot);
            let (version, json) = (snapshot.version, snapshot.metadata_json);
            let metadata: serde_json::Value =
                serde_json::from_slice(&json).context("decoding the cluster metadata")?;
            let wanted = match &command {
                TopicCommand::Describe { name } => Some(name.as_str()),
                _ => None,
            };
            let topics = metadata["topics"].as_object().cloned().unwrap_or_default();
            if let Some(name) = wanted {
                let t = topics
                    .get(name)
                    .with_context(|| format!("topic '{name}' does not exist"))?;
                println!("{}", serde_json::to_string_pretty(t)?);
                return Ok(());
            }
            println!("metadata version {version}");
            for (name, t) in topics {
                let partitions = t["partitions"].as_array().map_or(0, Vec::len);
                println!(
                    "{name}\tpartitions={partitions}\treplication={}",
                    t["replication_factor"]
                );
            }
        }
    }
    Ok(())
}

/// The controller's metadata as JSON.
async fn metadata_json(admin: &mut ControllerAdmin) -> anyhow::Result<serde_json::Value> {
    let snapshot = admin
        .metadata_snapshot()
        .await
        .context("reading the cluster metadata")?;
    serde_json::from_slice(&snapshot.metadata_json).context("decoding the cluster metadata")
}

/// Polls the metadata until none of `partitions` of `topic` is moving, with a bar of the
/// partitions done and the ones still copying.
async fn wait_for_moves(
    admin: &mut ControllerAdmin,
    topic: &str,
    partitions: &[u32],
) -> anyhow::Result<()> {
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(partitions.len() as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "moving {bar:30} {pos}/{len} partitions, {elapsed} {msg}",
        )
        .expect("a valid template"),
    );
    loop {
        let metadata = metadata_json(admin).await?;
        let parts = metadata["topics"][topic]["partitions"]
            .as_array()
            .with_context(|| format!("topic '{topic}' was deleted while it moved"))?;
        let moving: Vec<String> = partitions
            .iter()
            .filter_map(|p| {
                let r = &parts.get(*p as usize)?["reassignment"];
                (!r.is_null()).then(|| {
                    format!(
                        "{topic}-{p} copying to {} (ISR {})",
                        r["target"], parts[*p as usize]["isr"]
                    )
                })
            })
            .collect();
        bar.set_position((partitions.len() - moving.len()) as u64);
        if moving.is_empty() {
            bar.finish_with_message("done");
            println!(
                "all {} partitions are on their new replicas",
                partitions.len()
            );
            return Ok(());
        }
        bar.set_message(moving.first().cloned().unwrap_or_default());
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// `strata produce`: lines from stdin to a topic through the gRPC data plane.
#[derive(clap::Args)]
pub struct ProduceArgs {
    /// Any broker's gRPC listener.
    #[arg(long, default_value = "127.0.0.1:9095")]
    pub grpc: String,
    #[arg(long, short)]
    pub topic: String,
    /// Split each line into key and value at the first occurrence of this string.
    #[arg(long, short = 'K')]
    pub key_separator: Option<String>,
    /// -1 (all), 1 or 0.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub acks: i16,
    /// Print "partition offset" for every record.
    #[arg(long)]
    pub print_offsets: bool,
}

/// `strata consume`: a topic's records through the gRPC data plane.
#[derive(clap::Args)]
pub struct ConsumeArgs {
    #[arg(long, default_value = "127.0.0.1:9095")]
    pub grpc: String,
    #[arg(long, short)]
    pub topic: String,
    /// Stop after this many records.
    #[arg(long)]
    pub count: Option<usize>,
    /// Stop when nothing arrives for this long (e.g. "5s").
    #[arg(long, default_value = "5s")]
    pub idle: humantime::Duration,
    /// Consume as a member of this consumer group: partitions assigned by the
    /// coordinator, starting from the group's committed offsets, committing as it goes.
    #[arg(long, short)]
    pub group: Option<String>,
    /// The group's assignor: range, roundrobin or sticky.
    #[arg(long, default_value = "range")]
    pub assignor: String,
}

pub async fn produce(args: ProduceArgs) -> anyhow::Result<()> {
    use std::io::BufRead;
    use strata_client::native::{Cluster, Producer, ProducerConfig};
    let cluster = Cluster::connect(std::slice::from_ref(&args.grpc))
        .await
        .with_context(|| format!("connecting to {}", args.grpc))?;
    let config = ProducerConfig {
        acks: args.acks,
        idempotent: args.acks == -1,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(cluster, config)
        .await
        .context("starting the producer")?;
    let mut waiting = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading stdin")?;
        let (key, value) = match &args.key_separator {
            Some(sep) => match line.split_once(sep.as_str()) {
                Some((k, v)) => (Some(bytes::Bytes::from(k.to_string())), v.to_string()),
                None => (None, line.clone()),
            },
            None => (None, line.clone()),
        };
        waiting.push(
            producer
                .send(&args.topic, key, bytes::Bytes::from(value))
                .await?,
        );
    }
    let total = waiting.len();
    for w in waiting {
        let delivered = w.await.context("the producer stopped")??;
        if args.print_offsets {
            println!("{} {}", delivered.partition, delivered.offset);
        }
    }
    eprintln!("produced {total} records to {}", args.topic);
    Ok(())
}

fn print_record(r: &strata_client::native::Consumed) {
    let text = |b: &Option<bytes::Bytes>| {
        b.as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    println!(
        "{} {} {} {}",
        r.partition,
        r.offset,
        text(&r.key),
        text(&r.value)
    );
}

/// `strata consume --group`: a native group member, committing after each poll.
async fn consume_in_group(
    cluster: std::sync::Arc<strata_client::native::Cluster>,
    args: &ConsumeArgs,
    group: &str,
) -> anyhow::Result<()> {
    use strata_client::native::{GroupConsumer, GroupConsumerConfig};
    let mut consumer = GroupConsumer::join(
        cluster,
        GroupConsumerConfig {
            group: group.to_string(),
            topics: vec![args.topic.clone()],
            assignor: args.assignor.clone(),
            ..GroupConsumerConfig::default()
        },
    )
    .await
    .with_context(|| format!("joining group '{group}'"))?;
    eprintln!(
        "joined group {group} as {} (generation {}), partitions {:?}",
        consumer.member_id(),
        consumer.generation(),
        consumer
            .assignment()
            .iter()
            .map(|(_, p)| *p)
            .collect::<Vec<_>>()
    );
    let idle: std::time::Duration = args.idle.into();
    let mut seen = 0usize;
    let mut last = std::time::Instant::now();
    while args.count.is_none_or(|c| seen < c) && last.elapsed() < idle {
        let records = consumer.poll(std::time::Duration::from_millis(200)).await?;
        if records.is_empty() {
            continue;
        }
        last = std::time::Instant::now();
        for (_, r) in &records {
            print_record(r);
            seen += 1;
        }
        if let Err(e) = consumer.commit().await {
            eprintln!("commit failed (the records will be read again): {e}");
        }
    }
    consumer.close().await.context("leaving the group")?;
    Ok(())
}

pub async fn consume(args: ConsumeArgs) -> anyhow::Result<()> {
    use strata_client::native::{Cluster, Consumer};
    let cluster = Cluster::connect(std::slice::from_ref(&args.grpc))
        .await
        .with_context(|| format!("connecting to {}", args.grpc))?;
    if let Some(group) = &args.group {
        return consume_in_group(cluster, &args, group).await;
    }
    let mut consumer = Consumer::from_offset(cluster, &args.topic, 0).await?;
    let idle: std::time::Duration = args.idle.into();
    let mut seen = 0usize;
    let mut last = std::time::Instant::now();
    while args.count.is_none_or(|c| seen < c) && last.elapsed() < idle {
        let records = consumer.poll(std::time::Duration::from_millis(200)).await?;
        if !records.is_empty() {
            last = std::time::Instant::now();
        }
        for r in records {
            if args.count.is_some_and(|c| seen >= c) {
                break;
            }
            print_record(&r);
            seen += 1;
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum GroupCommand {
    /// List the consumer groups of every broker.
    List,
    /// Show a group's state, members, and each partition's committed offset and lag.
    Describe { group: String },
    /// Move a group's committed offsets for a topic. Shows the plan; commits it only with
    /// --execute, and only while the group has no members.
    ResetOffsets {
        group: String,
        #[arg(long, short)]
        topic: String,
        #[arg(long, group = "target")]
        to_earliest: bool,
        #[arg(long, group = "target")]
        to_latest: bool,
        /// An RFC 3339 time (2026-11-29T12:00:00Z) or milliseconds since the epoch.
        #[arg(long, group = "target", value_name = "TIME")]
        to_datetime: Option<String>,
        #[arg(long, group = "target", value_name = "OFFSET")]
        to_offset: Option<i64>,
        /// Commit the new offsets (without it, nothing changes).
        #[arg(long)]
        execute: bool,
    },
}

fn parse_time(text: &str) -> anyhow::Result<i64> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    let t = humantime::parse_rfc3339_weak(text).with_context(|| {
        format!("--to-datetime '{text}' is neither RFC 3339 (2026-11-29T12:00:00Z) nor epoch milliseconds")
    })?;
    Ok(t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64))
}

pub async fn group(bootstrap: &str, command: GroupCommand) -> anyhow::Result<()> {
    use strata_client::groups::{GroupAdmin, ResetTarget};
    let mut admin = GroupAdmin::connect(bootstrap)
        .await
        .with_context(|| format!("connecting to {bootstrap} (is `strata dev` running?)"))?;
    let dash = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    match command {
        GroupCommand::List => {
            let groups = admin.list().await.context("listing groups")?;
            println!("GROUP\tSTATE\tPROTOCOL-TYPE\tCOORDINATOR");
            for g in groups {
                let kind = if g.protocol_type.is_empty() {
                    "-"
                } else {
                    &g.protocol_type
                };
                println!("{}\t{}\t{kind}\t{}", g.group, g.state, g.coordinator);
            }
        }
        GroupCommand::Describe { group } => {
            let d = admin
                .describe(&group)
                .await
                .with_context(|| format!("describing group '{group}'"))?;
            if d.state == "Dead" && d.members.is_empty() && d.positions.is_empty() {
                bail!("group '{group}' does not exist (no members and no committed offsets)");
            }
            println!(
                "group {}\nstate {}\nprotocol {} {}\ncoordinator {}\nmembers {}",
                d.group,
                d.state,
                if d.protocol_type.is_empty() {
                    "-"
                } else {
                    &d.protocol_type
                },
                if d.protocol.is_empty() {
                    "-"
                } else {
                    &d.protocol
                },
                d.coordinator,
                d.members.len()
            );
            for m in &d.members {
                let parts: Vec<String> = m
                    .partitions
                    .iter()
                    .map(|(t, p)| format!("{t}-{p}"))
                    .collect();
                println!(
                    "  {}\tclient {}\thost {}{}\tpartitions {}",
                    m.member_id,
                    m.client_id,
                    m.client_host,
                    m.instance_id
                        .as_ref()
                        .map(|i| format!("\tinstance {i}"))
                        .unwrap_or_default(),
                    parts.join(",")
                );
            }
            println!("TOPIC\tPARTITION\tCOMMITTED\tLOG-END\tLAG\tMEMBER");
            let mut total = 0i64;
            for p in &d.positions {
                total += p.lag().unwrap_or(0);
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    p.topic,
                    p.partition,
                    dash(p.committed),
                    dash(p.log_end),
                    dash(p.lag()),
                    p.owner.as_deref().unwrap_or("-")
                );
            }
            println!("total lag {total}");
        }
        GroupCommand::ResetOffsets {
            group,
            topic,
            to_earliest,
            to_latest,
            to_datetime,
            to_offset,
            execute,
        } => {
            let target = match (to_earliest, to_latest, to_datetime, to_offset) {
                (true, ..) => ResetTarget::Earliest,
                (_, true, ..) => ResetTarget::Latest,
                (_, _, Some(t), _) => ResetTarget::Timestamp(parse_time(&t)?),
                (_, _, _, Some(o)) => ResetTarget::Offset(o),
                _ => bail!(
                    "say where to: --to-earliest, --to-latest, --to-datetime TIME or --to-offset N"
                ),
            };
            let state = admin
                .describe(&group)
                .await
                .with_context(|| format!("describing group '{group}'"))?;
            let plan = admin
                .plan_reset(&group, &topic, target)
                .await
                .with_context(|| format!("planning the reset of '{group}' on '{topic}'"))?;
            println!("TOPIC\tPARTITION\tCOMMITTED\tNEW");
            for (p, old, new) in &plan {
                println!("{topic}\t{p}\t{}\t{new}", dash(*old));
            }
            if !execute {
                println!("dry run: nothing changed; add --execute to commit these offsets");
                return Ok(());
            }
            if !state.members.is_empty() {
                bail!(
                    "group '{group}' has {} active member(s) (state {}); stop its consumers before resetting offsets",
                    state.members.len(),
                    state.state
                );
            }
            admin
                .execute_reset(&group, &topic, &plan)
                .await
                .with_context(|| format!("committing the new offsets of '{group}'"))?;
            println!(
                "reset {} partition(s) of {topic} for group {group}",
                plan.len()
            );
        }
    }
    Ok(())
}
