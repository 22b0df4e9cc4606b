//! The `strata topic` admin commands, spoken over the Kafka protocol to any broker.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use clap::Subcommand;
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
