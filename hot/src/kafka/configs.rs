//! DescribeConfigs, the legacy AlterConfigs (API 33) and IncrementalAlterConfigs: topic
//! configs (each described with its source, type, Kafka's broker-level synonym and what it
//! does here) and this broker's own settings (read-only: they come from the config file).

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse as LegacyResourceResponse;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use strata_controller::metadata::acl::Operation;

use super::{codes, s, Request};
use crate::broker::ConfigSource;
use crate::log::config::{LIST_CONFIGS, TOPIC_CONFIG_KEYS};

/// Resource types (Kafka's numbers).
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

/// DescribeConfigs config sources (Kafka's numbers).
pub(super) const SOURCE_TOPIC: i8 = 1;
pub(super) const SOURCE_STATIC_BROKER: i8 = 4;
pub(super) const SOURCE_DEFAULT: i8 = 5;

/// DescribeConfigs config types (Kafka's numbers).
const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_DOUBLE: i8 = 6;
const TYPE_LIST: i8 = 7;
const TYPE_CLASS: i8 = 8;
const TYPE_PASSWORD: i8 = 9;

/// IncrementalAlterConfigs operations (Kafka's numbers).
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// What DescribeConfigs says about a topic config: its type, the broker-level config Kafka
/// names as its synonym, and what it does in Strata.
pub(super) struct TopicConfigInfo {
    pub config_type: i8,
    pub broker_synonym: Option<&'static str>,
    pub doc: &'static str,
}

/// Every key of [`TOPIC_CONFIG_KEYS`] (a unit test holds the two lists together).
pub(super) fn topic_config_info(key: &str) -> Option<TopicConfigInfo> {
    let (config_type, broker_synonym, doc) = match key {
        "cleanup.policy" => (TYPE_LIST, Some("log.cleanup.policy"), "delete, compact or both. Compacted by the brokers, or in the cold tier (strata-compactor) when tiered"),
        "compression.gzip.level" => (TYPE_INT, Some("compression.gzip.level"), "The level the leader re-encodes batches at when compression.type names this codec (KIP-390)"),
        "compression.lz4.level" => (TYPE_INT, Some("compression.lz4.level"), "The level the leader re-encodes batches at when compression.type names this codec (KIP-390)"),
        "compression.type" => (TYPE_STRING, Some("compression.type"), "The codec batches are stored in: 'producer' keeps the producer's, a codec name makes the leader re-encode batches in any other"),
        "compression.zstd.level" => (TYPE_INT, Some("compression.zstd.level"), "The level the leader re-encodes batches at when compression.type names this codec (KIP-390)"),
        "delete.retention.ms" => (TYPE_LONG, Some("log.cleaner.delete.retention.ms"), "Compacted topics: how long a tombstone stays after its batch's timestamp"),
        "file.delete.delay.ms" => (TYPE_LONG, Some("log.segment.delete.delay.ms"), "Accepted and stored; Strata deletes a segment's files when retention removes it (readers keep open files readable), so no effect"),
        "flush.messages" => (TYPE_LONG, Some("log.flush.interval.messages"), "1: fsync every append before acks=all and before consumers see it; N: every N messages; 9223372036854775807: the OS"),
        "flush.ms" => (TYPE_LONG, Some("log.flush.interval.ms"), "Accepted and stored; Strata flushes by flush.messages only (by default every append), so no effect"),
        "follower.replication.throttled.replicas" => (TYPE_LIST, None, "Accepted and stored; Strata has no replication throttle, so no effect"),
        "index.interval.bytes" => (TYPE_INT, Some("log.index.interval.bytes"), "Bytes between offset-index entries"),
        "leader.replication.throttled.replicas" => (TYPE_LIST, None, "Accepted and stored; Strata has no replication throttle, so no effect"),
        "local.retention.bytes" => (TYPE_LONG, Some("log.local.retention.bytes"), "Tiered topics: bytes kept on local disk once uploaded (-2: retention.bytes)"),
        "local.retention.ms" => (TYPE_LONG, Some("log.local.retention.ms"), "Tiered topics: how long uploaded segments stay on local disk (-2: retention.ms)"),
        "max.compaction.lag.ms" => (TYPE_LONG, Some("log.cleaner.max.compaction.lag.ms"), "Compacted topics: strata-compactor compacts a partition whose oldest uncompacted segment is older than this, whatever its dirty ratio"),
        "max.message.bytes" => (TYPE_INT, Some("message.max.bytes"), "Largest batch accepted (MESSAGE_TOO_LARGE above)"),
        "message.downconversion.enable" => (TYPE_BOOLEAN, Some("log.message.downconversion.enable"), "Accepted and stored; Strata serves only RecordBatch v2 (Fetch v4+) and never down-converts, so no effect"),
        "message.format.version" => (TYPE_STRING, Some("log.message.format.version"), "Deprecated in Kafka 3.0; accepted and stored, Strata always writes RecordBatch v2, so no effect"),
        "message.timestamp.after.max.ms" => (TYPE_LONG, Some("log.message.timestamp.after.max.ms"), "CreateTime: records more than this ahead of the broker's clock are refused (INVALID_TIMESTAMP)"),
        "message.timestamp.before.max.ms" => (TYPE_LONG, Some("log.message.timestamp.before.max.ms"), "CreateTime: records more than this behind the broker's clock are refused (INVALID_TIMESTAMP)"),
        "message.timestamp.difference.max.ms" => (TYPE_LONG, Some("log.message.timestamp.difference.max.ms"), "Deprecated (KIP-937): before.max.ms and after.max.ms take this value when left at their defaults"),
        "message.timestamp.type" => (TYPE_STRING, Some("log.message.timestamp.type"), "CreateTime keeps the producer's timestamps; LogAppendTime stamps each batch with the leader's append time"),
        "min.acks" => (TYPE_STRING, None, "Strata's own: the weakest acks a producer may use (0, 1 or all); weaker ones get INVALID_REQUIRED_ACKS"),
        "transactions.required" => (TYPE_BOOLEAN, None, "Strata's own: only transactional producers may write; other batches get INVALID_RECORD"),
        "min.cleanable.dirty.ratio" => (TYPE_DOUBLE, Some("log.cleaner.min.cleanable.ratio"), "Compacted topics: the share of uncompacted bytes that makes a partition due"),
        "min.compaction.lag.ms" => (TYPE_LONG, Some("log.cleaner.min.compaction.lag.ms"), "Compacted topics: how old records must be before they are compacted"),
        "min.insync.replicas" => (TYPE_INT, Some("min.insync.replicas"), "In-sync replicas an acks=all produce needs"),
        "preallocate" => (TYPE_BOOLEAN, Some("log.preallocate"), "Accepted and stored; Strata does not preallocate segment files, so no effect"),
        "remote.storage.enable" => (TYPE_BOOLEAN, None, "Upload sealed segments to the cold tier"),
        "retention.bytes" => (TYPE_LONG, Some("log.retention.bytes"), "Delete oldest sealed segments while the partition is larger (-1: no limit)"),
        "retention.ms" => (TYPE_LONG, Some("log.retention.ms"), "Delete sealed segments whose newest record is older (-1: keep forever)"),
        "segment.bytes" => (TYPE_INT, Some("log.segment.bytes"), "Roll the active segment at this size"),
        "segment.index.bytes" => (TYPE_INT, Some("log.index.size.max.bytes"), "Accepted and stored; Strata's indexes grow with their segment, so no effect"),
        "segment.jitter.ms" => (TYPE_LONG, Some("log.roll.jitter.ms"), "Accepted and stored; Strata rolls at segment.ms exactly, so no effect"),
        "segment.ms" => (TYPE_LONG, Some("log.roll.ms"), "Roll the active segment at this age"),
        "unclean.leader.election.enable" => (TYPE_BOOLEAN, Some("unclean.leader.election.enable"), "Let an out-of-sync replica lead when no in-sync one is alive"),
        _ => return None,
    };
    Some(TopicConfigInfo {
        config_type,
        broker_synonym,
        doc,
    })
}

pub(super) fn source_code(source: ConfigSource) -> i8 {
    match source {
        ConfigSource::Topic => SOURCE_TOPIC,
        ConfigSource::Broker => SOURCE_STATIC_BROKER,
        ConfigSource::Default => SOURCE_DEFAULT,
    }
}

/// One described config before it is encoded.
struct Described {
    name: String,
    value: Option<String>,
    source: i8,
    read_only: bool,
    sensitive: bool,
    config_type: i8,
    doc: &'static str,
    synonyms: Vec<(String, Option<String>, i8)>,
}

impl Described {
    fn encode(self, synonyms: bool, documentation: bool) -> DescribeConfigsResourceResult {
        DescribeConfigsResourceResult::default()
            .with_name(s(self.name))
            // a secret's value is never returned, as Kafka answers
            .with_value(if self.sensitive {
                None
            } else {
                self.value.map(s)
            })
            .with_read_only(self.read_only)
            .with_config_source(self.source)
            .with_is_sensitive(self.sensitive)
            .with_config_type(self.config_type)
            .with_documentation(documentation.then(|| s(self.doc)))
            .with_synonyms(if synonyms {
                self.synonyms
                    .into_iter()
                    .map(|(name, value, source)| {
                        DescribeConfigsSynonym::default()
                            .with_name(s(name))
                            .with_value(if self.sensitive { None } else { value.map(s) })
                            .with_source(source)
                    })
                    .collect()
            } else {
                Vec::new()
            })
    }
}

/// A topic's configs: every one with its effective value and source; the synonyms in
/// Kafka's order of precedence (the topic's own, `[topics.defaults]` under the broker-level
/// name, the built-in default).
fn describe_topic(ctx: &Request, name: &str) -> Result<Vec<Described>, (i16, String)> {
    let broker = ctx.broker();
    if !ctx.may_topic(Operation::DescribeConfigs, name) {
        return Err((
            codes::TOPIC_AUTHORIZATION_FAILED,
            format!("{} may not describe the configs of {name}", ctx.principal),
        ));
    }
    let Some(topic) = broker.topic(name) else {
        return Err((
            codes::UNKNOWN_TOPIC_OR_PARTITION,
            format!("topic '{name}' does not exist"),
        ));
    };
    let defaults = &broker.config().topic_defaults;
    Ok(broker
        .describe_configs(&topic.spec)
        .into_iter()
        .map(|(key, value, source)| {
            let info = topic_config_info(&key);
            let (config_type, synonym, doc) = info
                .map(|i| (i.config_type, i.broker_synonym, i.doc))
                .unwrap_or((TYPE_STRING, None, ""));
            let mut synonyms = Vec::new();
            if let Some(v) = topic.spec.configs.get(&key) {
                synonyms.push((key.clone(), Some(v.clone()), SOURCE_TOPIC));
            }
            let broker_name = synonym.unwrap_or(&key).to_string();
            if let Some(v) = defaults.get(&key) {
                synonyms.push((broker_name.clone(), Some(v.clone()), SOURCE_STATIC_BROKER));
            }
            let built_in = TOPIC_CONFIG_KEYS
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string());
            synonyms.push((broker_name, built_in, SOURCE_DEFAULT));
            Described {
                name: key,
                value: Some(value),
                source: source_code(source),
                read_only: false,
                sensitive: false,
                config_type,
                doc,
                synonyms,
            }
        })
        .collect())
}

/// This broker's settings, as Kafka names them. All read-only (Strata reads them from its
/// config file at start); the topic defaults under their broker-level names.
fn describe_broker(ctx: &Request, name: &str) -> Result<Vec<Described>, (i16, String)> {
    let broker = ctx.broker();
    let config = broker.config();
    let me = config.node_id;
    if !ctx.may_cluster(Operation::DescribeConfigs) {
        return Err((
            codes::CLUSTER_AUTHORIZATION_FAILED,
            format!("{} may not describe broker configs", ctx.principal),
        ));
    }
    if name.is_empty() {
        // the cluster-wide dynamic defaults: Strata has none
        return Ok(Vec::new());
    }
    if name != me.to_string() {
        return Err((
            codes::INVALID_REQUEST,
            format!("Unexpected broker id, expected {me} or empty string, but received {name}"),
        ));
    }
    let rack = broker
        .cluster()
        .and_then(|link| link.metadata().borrow().brokers.get(&me)?.rack.clone());
    let listener = ctx.listener();
    let fixed = |name: &str, value: Option<String>, config_type: i8, doc: &'static str| {
        let source = if value.is_some() {
            SOURCE_STATIC_BROKER
        } else {
            SOURCE_DEFAULT
        };
        Described {
            name: name.to_string(),
            synonyms: vec![(name.to_string(), value.clone(), source)],
            value,
            source,
            read_only: true,
            sensitive: false,
            config_type,
            doc,
        }
    };
    let ms = |d: std::time::Duration| Some(d.as_millis().to_string());
    let groups = &config.groups;
    let mut out = vec![
        fixed(
            "broker.id",
            Some(me.to_string()),
            TYPE_INT,
            "This broker's id (node_id)",
        ),
        fixed(
            "node.id",
            Some(me.to_string()),
            TYPE_INT,
            "This broker's id (node_id)",
        ),
        fixed(
            "broker.rack",
            rack,
            TYPE_STRING,
            "This broker's rack ([cluster] rack), for rack-aware placement",
        ),
        fixed(
            "replica.selector.class",
            (config.replica_selector == crate::config::ReplicaSelector::RackAware)
                .then(|| "org.apache.kafka.common.replica.RackAwareReplicaSelector".to_string()),
            TYPE_CLASS,
            "Which replica consumers fetch from ([cluster] replica_selector): the leader, \
             or with rack-aware an in-sync follower in the consumer's client.rack (KIP-392)",
        ),
        fixed(
            "advertised.listeners",
            Some(format!(
                "{}://{}:{}",
                listener.name, listener.advertised_host, listener.advertised_port
            )),
            TYPE_STRING,
            "The listener this request came in on, as clients are told to reach it",
        ),
        fixed(
            "listener.security.protocol.map",
            Some(format!("{}:{:?}", listener.name, listener.protocol).to_uppercase()),
            TYPE_LIST,
            "The security protocol of the listener this request came in on",
        ),
        fixed(
            "sasl.enabled.mechanisms",
            Some(
                listener
                    .sasl_mechanisms
                    .iter()
                    .map(|m| m.name())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            TYPE_LIST,
            "SASL mechanisms offered on this listener",
        ),
        fixed(
            "log.dirs",
            Some(config.data_dir.join("logs").display().to_string()),
            TYPE_STRING,
            "Where partition logs live (data_dir/logs)",
        ),
        fixed(
            "num.partitions",
            Some(config.default_partitions.to_string()),
            TYPE_INT,
            "Partitions of a topic created without a count ([topics] default_partitions)",
        ),
        fixed(
            "default.replication.factor",
            Some("1".into()),
            TYPE_INT,
            "Replication factor of a topic created without one",
        ),
        fixed(
            "auto.create.topics.enable",
            Some(config.auto_create_topics.to_string()),
            TYPE_BOOLEAN,
            "Whether Metadata creates unknown topics ([topics] auto_create)",
        ),
        fixed(
            "log.retention.check.interval.ms",
            ms(config.retention_check_interval),
            TYPE_LONG,
            "How often retention runs",
        ),
        fixed(
            "producer.id.expiration.ms",
            ms(config.producer_id_expiration),
            TYPE_INT,
            "A producer id with no batch for this long is forgotten (KIP-854)",
        ),
        fixed(
            "replica.lag.time.max.ms",
            ms(config.replica_lag_time_max),
            TYPE_LONG,
            "How long a follower may lag before it leaves the ISR",
        ),
        fixed(
            "remote.log.storage.system.enable",
            Some(config.tier.is_some().to_string()),
            TYPE_BOOLEAN,
            "Whether a cold tier is configured ([cold])",
        ),
        fixed(
            "socket.request.max.bytes",
            Some(listener.max_request_bytes.to_string()),
            TYPE_INT,
            "Largest request frame accepted (kafka.max_request_bytes)",
        ),
        fixed(
            "connections.max.idle.ms",
            ms(listener.idle_timeout),
            TYPE_LONG,
            "Idle connections are closed after this (kafka.idle_timeout)",
        ),
        fixed(
            "fetch.max.bytes",
            Some(listener.fetch_max_bytes.to_string()),
            TYPE_INT,
            "Most record bytes in one fetch response (kafka.fetch_max_bytes)",
        ),
        fixed(
            "group.initial.rebalance.delay.ms",
            Some(groups.group.initial_rebalance_delay_ms.to_string()),
            TYPE_INT,
            "How long a group that was empty waits for more members",
        ),
        fixed(
            "group.min.session.timeout.ms",
            Some(groups.group.min_session_timeout_ms.to_string()),
            TYPE_INT,
            "Shortest session timeout a member may ask for",
        ),
        fixed(
            "group.max.session.timeout.ms",
            Some(groups.group.max_session_timeout_ms.to_string()),
            TYPE_INT,
            "Longest session timeout a member may ask for",
        ),
        fixed(
            "offsets.topic.num.partitions",
            Some(groups.offsets_partitions.to_string()),
            TYPE_INT,
            "Partitions of __consumer_offsets",
        ),
        fixed(
            "offsets.topic.replication.factor",
            Some(groups.offsets_replication_factor.to_string()),
            TYPE_INT,
            "Replication factor of __consumer_offsets",
        ),
    ];
    if listener.protocol.tls() {
        // the listener's private key: named, never shown
        out.push(Described {
            name: "ssl.keystore.key".into(),
            value: None,
            source: SOURCE_STATIC_BROKER,
            read_only: true,
            sensitive: true,
            config_type: TYPE_PASSWORD,
            doc: "The listener's private key (kafka.tls key file); never returned",
            synonyms: Vec::new(),
        });
    }
    // The topic defaults, under Kafka's broker-level names.
    for (key, default) in TOPIC_CONFIG_KEYS {
        let Some(info) = topic_config_info(key) else {
            continue;
        };
        let Some(name) = info.broker_synonym else {
            continue;
        };
        if out.iter().any(|d| d.name == name) {
            continue;
        }
        let (value, source) = match config.topic_defaults.get(*key) {
            Some(v) => (v.clone(), SOURCE_STATIC_BROKER),
            None => (default.to_string(), SOURCE_DEFAULT),
        };
        let mut synonyms = Vec::new();
        if source == SOURCE_STATIC_BROKER {
            synonyms.push((name.to_string(), Some(value.clone()), SOURCE_STATIC_BROKER));
        }
        synonyms.push((name.to_string(), Some(default.to_string()), SOURCE_DEFAULT));
        out.push(Described {
            name: name.to_string(),
            value: Some(value),
            source,
            read_only: true,
            sensitive: false,
            config_type: info.config_type,
            doc: info.doc,
            synonyms,
        });
    }
    Ok(out)
}

pub(super) fn describe_configs(
    ctx: &Request,
    req: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let synonyms = req.include_synonyms;
    let documentation = req.include_documentation;
    let results = req
        .resources
        .into_iter()
        .map(|r| {
            let result = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let name = r.resource_name.as_str();
            let described = match r.resource_type {
                RESOURCE_TOPIC => describe_topic(ctx, name),
                RESOURCE_BROKER => describe_broker(ctx, name),
                other => Err((
                    codes::INVALID_REQUEST,
                    format!("resource type {other} is not supported (topics and brokers are)"),
                )),
            };
            match described {
                Ok(configs) => result.with_configs(
                    configs
                        .into_iter()
                        .filter(|d| {
                            r.configuration_keys
                                .as_ref()
                                .is_none_or(|keys| keys.iter().any(|k| k.as_str() == d.name))
                        })
                        .map(|d| d.encode(synonyms, documentation))
                        .collect(),
                ),
                Err((code, msg)) => result
                    .with_error_code(code)
                    .with_error_message(Some(s(msg))),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// Durability and retention settings decide whether acknowledged records survive: changing
/// them takes Alter on the topic as well as AlterConfigs.
fn guards_durability(k: &str) -> bool {
    k == "min.acks"
        || k == "transactions.required"
        || k == "min.insync.replicas"
        || k.starts_with("retention.")
        || k.starts_with("local.retention.")
}

/// Checks the principal may change these configs of `name`; the refusal otherwise.
fn may_alter_topic(ctx: &Request, name: &str, keys: &[&str]) -> Result<(), (i16, String)> {
    let durability = keys.iter().any(|k| guards_durability(k));
    if ctx.may_topic(Operation::AlterConfigs, name)
        && (!durability || ctx.may_topic(Operation::Alter, name))
    {
        return Ok(());
    }
    Err((
        codes::TOPIC_AUTHORIZATION_FAILED,
        format!(
            "{} may not alter these configs of {name}{}",
            ctx.principal,
            if durability {
                " (durability and retention settings need Alter too)"
            } else {
                ""
            }
        ),
    ))
}

/// A broker resource: AlterConfigs on the cluster, then Kafka's refusal of every config that
/// cannot change at runtime (all of them here; an empty change succeeds).
fn alter_broker(ctx: &Request, name: &str, keys: &[&str]) -> Result<(), (i16, String)> {
    if !ctx.may_cluster(Operation::AlterConfigs) {
        return Err((
            codes::CLUSTER_AUTHORIZATION_FAILED,
            format!("{} may not alter broker configs", ctx.principal),
        ));
    }
    let me = ctx.broker().config().node_id;
    if !name.is_empty() && name != me.to_string() {
        return Err((
            codes::INVALID_REQUEST,
            format!("Unexpected broker id, expected {me} or empty string, but received {name}"),
        ));
    }
    if keys.is_empty() {
        return Ok(());
    }
    Err((
        codes::INVALID_REQUEST,
        format!(
            "Invalid config value for resource ConfigResource(type=BROKER, name='{name}'): \
             Cannot update these configs dynamically: {}; Strata reads broker configs from its \
             config file at start",
            keys.join(", ")
        ),
    ))
}

/// The names a resource's configs use, or the INVALID_REQUEST for one named twice (Kafka's).
fn distinct<'a>(names: impl Iterator<Item = &'a str>) -> Result<Vec<&'a str>, (i16, String)> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for n in names {
        if !seen.insert(n) {
            return Err((
                codes::INVALID_REQUEST,
                format!("Error due to duplicate config keys: {n}"),
            ));
        }
        out.push(n);
    }
    Ok(out)
}

/// The topic an alter names, or UNKNOWN_TOPIC_OR_PARTITION (asked after authorization, so
/// the answer tells nothing to whom may not alter it).
fn topic_to_alter(
    broker: &crate::broker::Broker,
    name: &str,
) -> Result<std::sync::Arc<crate::broker::Topic>, codes::Coded> {
    broker.topic(name).ok_or_else(|| {
        (
            codes::UNKNOWN_TOPIC_OR_PARTITION,
            format!("topic '{name}' does not exist"),
        )
    })
}

/// A resource type no alter applies to.
fn unalterable(resource_type: i8) -> codes::Coded {
    (
        codes::INVALID_REQUEST,
        format!("resource type {resource_type} cannot be altered (topics and brokers can)"),
    )
}

/// The legacy AlterConfigs (API 33): a resource's configs become exactly those given; the
/// others return to their defaults.
pub(super) async fn alter_configs_legacy(
    ctx: Request,
    req: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let broker = ctx.broker().clone();
    tracing::info!(principal = %ctx.principal, peer = %ctx.peer, resources = req.resources.len(), validate_only = req.validate_only, "AlterConfigs");
    let mut responses = Vec::with_capacity(req.resources.len());
    for r in req.resources {
        let resp = LegacyResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name.clone());
        let name = r.resource_name.as_str();
        let outcome = async {
            let keys = distinct(r.configs.iter().map(|c| c.name.as_str()))?;
            match r.resource_type {
                RESOURCE_TOPIC => {
                    // authorized before its existence is told, as Kafka does
                    may_alter_topic(&ctx, name, &keys)?;
                    let topic = topic_to_alter(&broker, name)?;
                    // a null value sets nothing (the config is left at its default)
                    let set: BTreeMap<String, String> = r
                        .configs
                        .iter()
                        .filter_map(|c| {
                            c.value
                                .as_ref()
                                .map(|v| (c.name.to_string(), v.to_string()))
                        })
                        .collect();
                    let remove: Vec<String> = topic
                        .spec
                        .configs
                        .keys()
                        .filter(|k| !set.contains_key(*k))
                        .cloned()
                        .collect();
                    let touched: Vec<&str> = keys
                        .iter()
                        .copied()
                        .chain(remove.iter().map(String::as_str))
                        .collect();
                    may_alter_topic(&ctx, name, &touched)?;
                    broker
                        .alter_topic_configs(name, set, remove, req.validate_only)
                        .await
                        .map_err(|e| codes::admin(&e))
                }
                RESOURCE_BROKER => alter_broker(&ctx, name, &keys),
                other => Err(unalterable(other)),
            }
        }
        .await;
        responses.push(match outcome {
            Ok(()) => resp,
            Err((code, msg)) => resp.with_error_code(code).with_error_message(Some(s(msg))),
        });
    }
    AlterConfigsResponse::default().with_responses(responses)
}

/// A list config's items after APPEND (added if missing, in order) or SUBTRACT (removed).
fn list_op(current: &str, items: &str, append: bool) -> String {
    let mut list: Vec<String> = current
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .collect();
    for item in items.split(',').map(str::trim).filter(|v| !v.is_empty()) {
        if append {
            if !list.iter().any(|v| v == item) {
                list.push(item.to_string());
            }
        } else {
            list.retain(|v| v != item);
        }
    }
    list.join(",")
}

/// IncrementalAlterConfigs: SET, DELETE, and APPEND / SUBTRACT on list configs (applied to
/// the config's effective value: the topic's own, else the broker default, else Kafka's).
pub(super) async fn incremental_alter_configs(
    ctx: Request,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let broker = ctx.broker().clone();
    tracing::info!(principal = %ctx.principal, peer = %ctx.peer, resources = req.resources.len(), validate_only = req.validate_only, "IncrementalAlterConfigs");
    let mut responses = Vec::with_capacity(req.resources.len());
    for r in req.resources {
        let resp = AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name.clone());
        let name = r.resource_name.as_str();
        let outcome = async {
            let keys = distinct(r.configs.iter().map(|c| c.name.as_str()))?;
            for c in &r.configs {
                if !(OP_SET..=OP_SUBTRACT).contains(&c.config_operation) {
                    return Err((
                        codes::INVALID_REQUEST,
                        format!(
                            "unknown operation {} on '{}' (SET 0, DELETE 1, APPEND 2, SUBTRACT 3)",
                            c.config_operation,
                            c.name.as_str()
                        ),
                    ));
                }
                if c.value.is_none() && c.config_operation != OP_DELETE {
                    return Err((
                        codes::INVALID_REQUEST,
                        format!("Null value not supported for : {}", c.name.as_str()),
                    ));
                }
            }
            match r.resource_type {
                RESOURCE_TOPIC => {
                    // authorized before its existence is told, as Kafka does
                    may_alter_topic(&ctx, name, &keys)?;
                    let topic = topic_to_alter(&broker, name)?;
                    let effective: BTreeMap<String, String> = broker
                        .describe_configs(&topic.spec)
                        .into_iter()
                        .map(|(k, v, _)| (k, v))
                        .collect();
                    let mut set = BTreeMap::new();
                    let mut remove = Vec::new();
                    for c in &r.configs {
                        let key = c.name.to_string();
                        let value = c.value.as_ref().map(|v| v.to_string()).unwrap_or_default();
                        match c.config_operation {
                            OP_SET => {
                                set.insert(key, value);
                            }
                            OP_DELETE => remove.push(key),
                            op => {
                                if !LIST_CONFIGS.contains(&key.as_str()) {
                                    let what = if op == OP_APPEND { "append" } else { "subtract" };
                                    return Err((
                                        codes::INVALID_CONFIG,
                                        format!(
                                            "Config value {what} is not allowed for config key: {key} \
                                             (only list configs: {})",
                                            LIST_CONFIGS.join(", ")
                                        ),
                                    ));
                                }
                                let current = effective.get(&key).map_or("", String::as_str);
                                let new = list_op(current, &value, op == OP_APPEND);
                                set.insert(key, new);
                            }
                        }
                    }
                    broker
                        .alter_topic_configs(name, set, remove, req.validate_only)
                        .await
                        .map_err(|e| codes::admin(&e))
                }
                RESOURCE_BROKER => alter_broker(&ctx, name, &keys),
                other => Err(unalterable(other)),
            }
        }
        .await;
        responses.push(match outcome {
            Ok(()) => resp,
            Err((code, msg)) => resp.with_error_code(code).with_error_message(Some(s(msg))),
        });
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_topic_config_is_described_with_a_type_and_meaning() {
        for (key, _) in TOPIC_CONFIG_KEYS {
            let info = topic_config_info(key).unwrap_or_else(|| panic!("{key} has no info"));
            assert!(!info.doc.is_empty(), "{key}");
        }
        for key in LIST_CONFIGS {
            assert_eq!(
                topic_config_info(key).unwrap().config_type,
                TYPE_LIST,
                "{key}"
            );
        }
    }

    #[test]
    fn append_and_subtract_keep_order_and_skip_repeats() {
        assert_eq!(list_op("delete", "compact", true), "delete,compact");
        assert_eq!(list_op("delete,compact", "compact", true), "delete,compact");
        assert_eq!(list_op("delete, compact", "delete", false), "compact");
        assert_eq!(list_op("", "0:1,1:1", true), "0:1,1:1");
        assert_eq!(list_op("0:1", "0:1", false), "");
    }

    #[test]
    fn a_sensitive_config_never_carries_its_value() {
        let d = Described {
            name: "ssl.keystore.key".into(),
            value: Some("secret".into()),
            source: SOURCE_STATIC_BROKER,
            read_only: true,
            sensitive: true,
            config_type: TYPE_PASSWORD,
            doc: "",
            synonyms: vec![(
                "ssl.keystore.key".into(),
                Some("secret".into()),
                SOURCE_STATIC_BROKER,
            )],
        }
        .encode(true, true);
        assert!(d.is_sensitive);
        assert_eq!(d.value, None);
        assert_eq!(d.synonyms[0].value, None);
    }
}
