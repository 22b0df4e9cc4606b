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
            let (_, json) = admin
                .metadata_json()
                .await
                .context("reading the cluster metadata")?;
            println!("{}", String::from_utf8_lossy(&json));
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
        TopicCommand::List | TopicCommand::Describe { .. } => {
            let (version, json) = admin
                .metadata_json()
                .await
                .context("reading the cluster metadata")?;
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
