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
use strata_controller::metadata::dynamic::ConfigScope;
use strata_core::dynamic_config::{
    self, broker_name_of, BrokerConfig, DynamicConfigError, GROUP_CONFIGS,
    STORED_ONLY_BROKER_CONFIGS,
};

/// Resource types (Kafka's numbers).
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const RESOURCE_GROUP: i8 = 32;

/// DescribeConfigs config sources (Kafka's numbers).
pub(super) const SOURCE_TOPIC: i8 = 1;
const SOURCE_DYNAMIC_BROKER: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT: i8 = 3;
pub(super) const SOURCE_STATIC_BROKER: i8 = 4;
pub(super) const SOURCE_DEFAULT: i8 = 5;
const SOURCE_GROUP: i8 = 8;

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
/// names as its synonym (strata-core's `dynamic_config::BROKER_SYNONYMS`), and what it does
/// in Strata.
pub(super) struct TopicConfigInfo {
    pub config_type: i8,
    pub broker_synonym: Option<&'static str>,
    pub doc: &'static str,
}

/// Every key of [`TOPIC_CONFIG_KEYS`] (a unit test holds the two lists together).
pub(super) fn topic_config_info(key: &str) -> Option<TopicConfigInfo> {
    let (config_type, doc) = match key {
        "cleanup.policy" => (TYPE_LIST, "delete, compact or both. Compacted by the brokers, or in the cold tier (strata-compactor) when tiered"),
        "compression.gzip.level" => (TYPE_INT, "The level the leader re-encodes batches at when compression.type names this codec (KIP-390)"),
        "compression.lz4.level" => (TYPE_INT, "The level the leader re-encodes batches at when compression.type names this codec (KIP-390)"),
        "compression.type" => (TYPE_STRING, "The codec batches are stored in: 'producer' keeps the producer's, a codec name makes the leader re-encode batches in any other"),
        "compression.zstd.level" => (TYPE_INT, "The level the leader re-encodes batches at when compression.type names this codec (KIP-390)"),
        "delete.retention.ms" => (TYPE_LONG, "Compacted topics: how long a tombstone stays after its batch's timestamp"),
        "file.delete.delay.ms" => (TYPE_LONG, "Accepted and stored; Strata deletes a segment's files when retention removes it (readers keep open files readable), so no effect"),
        "flush.messages" => (TYPE_LONG, "1: fsync every append before acks=all and before consumers see it; N: every N messages; 9223372036854775807: the OS"),
        "flush.ms" => (TYPE_LONG, "Accepted and stored; Strata flushes by flush.messages only (by default every append), so no effect"),
        "follower.replication.throttled.replicas" => (TYPE_LIST, "Accepted and stored; Strata has no replication throttle, so no effect"),
        "index.interval.bytes" => (TYPE_INT, "Bytes between offset-index entries"),
        "leader.replication.throttled.replicas" => (TYPE_LIST, "Accepted and stored; Strata has no replication throttle, so no effect"),
        "local.retention.bytes" => (TYPE_LONG, "Tiered topics: bytes kept on local disk once uploaded (-2: retention.bytes)"),
        "local.retention.ms" => (TYPE_LONG, "Tiered topics: how long uploaded segments stay on local disk (-2: retention.ms)"),
        "max.compaction.lag.ms" => (TYPE_LONG, "Compacted topics: strata-compactor compacts a partition whose oldest uncompacted segment is older than this, whatever its dirty ratio"),
        "max.message.bytes" => (TYPE_INT, "Largest batch accepted (MESSAGE_TOO_LARGE above)"),
        "message.downconversion.enable" => (TYPE_BOOLEAN, "Accepted and stored; Strata serves only RecordBatch v2 (Fetch v4+) and never down-converts, so no effect"),
        "message.format.version" => (TYPE_STRING, "Deprecated in Kafka 3.0; accepted and stored, Strata always writes RecordBatch v2, so no effect"),
        "message.timestamp.after.max.ms" => (TYPE_LONG, "CreateTime: records more than this ahead of the broker's clock are refused (INVALID_TIMESTAMP)"),
        "message.timestamp.before.max.ms" => (TYPE_LONG, "CreateTime: records more than this behind the broker's clock are refused (INVALID_TIMESTAMP)"),
        "message.timestamp.difference.max.ms" => (TYPE_LONG, "Deprecated (KIP-937): before.max.ms and after.max.ms take this value when left at their defaults"),
        "message.timestamp.type" => (TYPE_STRING, "CreateTime keeps the producer's timestamps; LogAppendTime stamps each batch with the leader's append time"),
        "min.acks" => (TYPE_STRING, "Strata's own: the weakest acks a producer may use (0, 1 or all); weaker ones get INVALID_REQUIRED_ACKS"),
        "transactions.required" => (TYPE_BOOLEAN, "Strata's own: only transactional producers may write; other batches get INVALID_RECORD"),
        "min.cleanable.dirty.ratio" => (TYPE_DOUBLE, "Compacted topics: the share of uncompacted bytes that makes a partition due"),
        "min.compaction.lag.ms" => (TYPE_LONG, "Compacted topics: how old records must be before they are compacted"),
        "min.insync.replicas" => (TYPE_INT, "In-sync replicas an acks=all produce needs"),
        "preallocate" => (TYPE_BOOLEAN, "Accepted and stored; Strata does not preallocate segment files, so no effect"),
        "remote.storage.enable" => (TYPE_BOOLEAN, "Upload sealed segments to the cold tier"),
        "retention.bytes" => (TYPE_LONG, "Delete oldest sealed segments while the partition is larger (-1: no limit)"),
        "retention.ms" => (TYPE_LONG, "Delete sealed segments whose newest record is older (-1: keep forever)"),
        "segment.bytes" => (TYPE_INT, "Roll the active segment at this size"),
        "segment.index.bytes" => (TYPE_INT, "Accepted and stored; Strata's indexes grow with their segment, so no effect"),
        "segment.jitter.ms" => (TYPE_LONG, "Accepted and stored; Strata rolls at segment.ms exactly, so no effect"),
        "segment.ms" => (TYPE_LONG, "Roll the active segment at this age"),
        "unclean.leader.election.enable" => (TYPE_BOOLEAN, "Let an out-of-sync replica lead when no in-sync one is alive"),
        _ => return None,
    };
    Some(TopicConfigInfo {
        config_type,
        broker_synonym: broker_name_of(key),
        doc,
    })
}

pub(super) fn source_code(source: ConfigSource) -> i8 {
    match source {
        ConfigSource::Topic => SOURCE_TOPIC,
        ConfigSource::DynamicBroker => SOURCE_DYNAMIC_BROKER,
        ConfigSource::DynamicDefault => SOURCE_DYNAMIC_DEFAULT,
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
    let layers = broker.topic_default_layers();
    Ok(broker
        .describe_configs(&topic.spec)
        .into_iter()
        .map(|(key, value, source)| {
            let info = topic_config_info(&key);
            let (config_type, doc) = info
                .map(|i| (i.config_type, i.doc))
                .unwrap_or((TYPE_STRING, ""));
            let mut synonyms = Vec::new();
            if let Some(v) = topic.spec.configs.get(&key) {
                synonyms.push((key.clone(), Some(v.clone()), SOURCE_TOPIC));
            }
            synonyms.extend(default_synonyms(&layers, &key));
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

/// The broker-level synonyms of topic config `key`, strongest first: each default layer
/// that sets it (under Kafka's broker-level name), then the built-in default.
fn default_synonyms(
    layers: &[(ConfigSource, BTreeMap<String, String>)],
    key: &str,
) -> Vec<(String, Option<String>, i8)> {
    let broker_name = broker_name_of(key).unwrap_or(key).to_string();
    let mut out: Vec<_> = layers
        .iter()
        .filter_map(|(source, l)| {
            let v = l.get(key)?;
            Some((broker_name.clone(), Some(v.clone()), source_code(*source)))
        })
        .collect();
    let built_in = TOPIC_CONFIG_KEYS
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string());
    out.push((broker_name, built_in, SOURCE_DEFAULT));
    out
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
    let (own, cluster) = broker.dynamic_broker_configs();
    if name.is_empty() {
        // the cluster-wide dynamic defaults, as Kafka answers for the resource ""
        return Ok(cluster
            .iter()
            .map(|(k, v)| dynamic_described(k, v.clone(), SOURCE_DYNAMIC_DEFAULT))
            .collect());
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
            "connections.max.reauth.ms",
            Some(listener.max_reauth.map_or(0, |d| d.as_millis()).to_string()),
            TYPE_LONG,
            "How long a SASL session lasts before the client must re-authenticate (KIP-368; \
             [kafka.sasl] connections_max_reauth); 0: never",
        ),
        fixed(
            "connection.failed.authentication.delay.ms",
            Some(listener.failed_authentication_delay.as_millis().to_string()),
            TYPE_INT,
            "A failed login is answered and its connection closed after this long \
             ([kafka.sasl] failed_authentication_delay)",
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
            "group.consumer.session.timeout.ms",
            Some(groups.consumer.session_timeout_ms.to_string()),
            TYPE_INT,
            "Session timeout of consumer-protocol members whose group sets none",
        ),
        fixed(
            "group.consumer.min.session.timeout.ms",
            Some(groups.consumer.min_session_timeout_ms.to_string()),
            TYPE_INT,
            "Shortest consumer.session.timeout.ms a group may set",
        ),
        fixed(
            "group.consumer.max.session.timeout.ms",
            Some(groups.consumer.max_session_timeout_ms.to_string()),
            TYPE_INT,
            "Longest consumer.session.timeout.ms a group may set",
        ),
        fixed(
            "group.consumer.heartbeat.interval.ms",
            Some(groups.consumer.heartbeat_interval_ms.to_string()),
            TYPE_INT,
            "Heartbeat interval of consumer-protocol members whose group sets none",
        ),
        fixed(
            "group.consumer.min.heartbeat.interval.ms",
            Some(groups.consumer.min_heartbeat_interval_ms.to_string()),
            TYPE_INT,
            "Shortest consumer.heartbeat.interval.ms a group may set",
        ),
        fixed(
            "group.consumer.max.heartbeat.interval.ms",
            Some(groups.consumer.max_heartbeat_interval_ms.to_string()),
            TYPE_INT,
            "Longest consumer.heartbeat.interval.ms a group may set",
        ),
        fixed(
            "group.consumer.migration.policy",
            Some(groups.group.migration.name().to_string()),
            TYPE_STRING,
            "Whether groups with members move between the classic and the consumer protocol",
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
    // Kafka's other dynamic broker configs: set here, for the cluster, or Kafka's default.
    for c in STORED_ONLY_BROKER_CONFIGS {
        let mut synonyms = Vec::new();
        if let Some(v) = own.get(c.name) {
            synonyms.push((c.name.to_string(), Some(v.clone()), SOURCE_DYNAMIC_BROKER));
        }
        if let Some(v) = cluster.get(c.name) {
            synonyms.push((c.name.to_string(), Some(v.clone()), SOURCE_DYNAMIC_DEFAULT));
        }
        synonyms.push((
            c.name.to_string(),
            c.default.map(str::to_string),
            SOURCE_DEFAULT,
        ));
        let (_, value, source) = synonyms[0].clone();
        out.push(Described {
            name: c.name.to_string(),
            value,
            source,
            read_only: false,
            sensitive: false,
            config_type: value_type_code(c.value_type),
            doc: c.doc,
            synonyms,
        });
    }
    // The topic defaults, under Kafka's broker-level names; dynamic but for
    // log.message.format.version.
    let layers = broker.topic_default_layers();
    for (key, _) in TOPIC_CONFIG_KEYS {
        let Some(info) = topic_config_info(key) else {
            continue;
        };
        let Some(name) = info.broker_synonym else {
            continue;
        };
        if out.iter().any(|d| d.name == name) {
            continue;
        }
        let synonyms = default_synonyms(&layers, key);
        let (_, value, source) = synonyms[0].clone();
        out.push(Described {
            name: name.to_string(),
            value,
            source,
            read_only: dynamic_config::broker_config(name).is_none(),
            sensitive: false,
            config_type: info.config_type,
            doc: info.doc,
            synonyms,
        });
    }
    Ok(out)
}

/// Kafka's config type of a stored-only dynamic config.
fn value_type_code(t: dynamic_config::ValueType) -> i8 {
    match t {
        dynamic_config::ValueType::Int { max, .. } if max > i32::MAX as i64 => TYPE_LONG,
        dynamic_config::ValueType::Int { .. } => TYPE_INT,
        dynamic_config::ValueType::Double { .. } => TYPE_DOUBLE,
        dynamic_config::ValueType::Text => TYPE_STRING,
    }
}

/// A dynamic broker config as set at one scope, with what it does here.
fn dynamic_described(name: &str, value: String, source: i8) -> Described {
    let (config_type, doc) = match dynamic_config::broker_config(name) {
        Some(BrokerConfig::StoredOnly(c)) => (value_type_code(c.value_type), c.doc),
        Some(BrokerConfig::TopicDefault(t)) => topic_config_info(t)
            .map(|i| (i.config_type, i.doc))
            .unwrap_or((TYPE_STRING, "")),
        None => (TYPE_STRING, ""),
    };
    Described {
        name: name.to_string(),
        synonyms: vec![(name.to_string(), Some(value.clone()), source)],
        value: Some(value),
        source,
        read_only: false,
        sensitive: false,
        config_type,
        doc,
    }
}

/// A consumer group's configs (KIP-848): each set one (GROUP_CONFIG) or its default. A
/// group that does not exist answers the defaults, as Kafka does.
fn describe_group(ctx: &Request, name: &str) -> Result<Vec<Described>, (i16, String)> {
    if !ctx.may_group(Operation::DescribeConfigs, name) {
        return Err((
            codes::GROUP_AUTHORIZATION_FAILED,
            format!(
                "{} may not describe the configs of group {name}",
                ctx.principal
            ),
        ));
    }
    let set = ctx.broker().cluster().and_then(|link| {
        link.metadata()
            .borrow()
            .dynamic_configs
            .groups
            .get(name)
            .cloned()
    });
    let bounds = ctx.broker().config().groups.consumer;
    Ok(GROUP_CONFIGS
        .iter()
        .map(|g| {
            let default = bounds.default_of(g.name).unwrap_or(g.default).to_string();
            let mut synonyms = Vec::new();
            if let Some(v) = set.as_ref().and_then(|l| l.get(g.name)) {
                synonyms.push((g.name.to_string(), Some(v.clone()), SOURCE_GROUP));
            }
            synonyms.push((g.name.to_string(), Some(default), SOURCE_DEFAULT));
            let (_, value, source) = synonyms[0].clone();
            Described {
                name: g.name.to_string(),
                value,
                source,
                read_only: false,
                sensitive: false,
                config_type: TYPE_INT,
                doc: g.doc,
                synonyms,
            }
        })
        .collect())
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
                RESOURCE_GROUP => describe_group(ctx, name),
                other => Err((
                    codes::INVALID_REQUEST,
                    format!(
                        "resource type {other} is not supported (topics, brokers and groups are)"
                    ),
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

/// A broker resource's scope ("": the cluster-wide default, this broker's id: its own),
/// once the principal may alter it: AlterConfigs on the cluster, and Alter too for the
/// durability and retention defaults, as for topics.
fn broker_scope(ctx: &Request, name: &str, keys: &[&str]) -> Result<ConfigScope, codes::Coded> {
    let durability = keys.iter().any(|k| {
        matches!(dynamic_config::broker_config(k),
            Some(BrokerConfig::TopicDefault(t)) if guards_durability(t))
    });
    if !ctx.may_cluster(Operation::AlterConfigs)
        || (durability && !ctx.may_cluster(Operation::Alter))
    {
        return Err((
            codes::CLUSTER_AUTHORIZATION_FAILED,
            format!(
                "{} may not alter these broker configs{}",
                ctx.principal,
                if durability {
                    " (durability and retention defaults need Alter on the cluster too)"
                } else {
                    ""
                }
            ),
        ));
    }
    let me = ctx.broker().config().node_id;
    if name.is_empty() {
        Ok(ConfigScope::ClusterDefault)
    } else if name == me.to_string() {
        Ok(ConfigScope::Broker(me))
    } else {
        Err((
            codes::INVALID_REQUEST,
            format!("Unexpected broker id, expected {me} or empty string, but received {name}"),
        ))
    }
}

/// A group resource's scope, once the principal may alter its configs.
fn group_scope(ctx: &Request, name: &str) -> Result<ConfigScope, codes::Coded> {
    if !ctx.may_group(Operation::AlterConfigs, name) {
        return Err((
            codes::GROUP_AUTHORIZATION_FAILED,
            format!(
                "{} may not alter the configs of group {name}",
                ctx.principal
            ),
        ));
    }
    if let Some(why) = crate::group::invalid_group_id(name) {
        return Err((codes::INVALID_REQUEST, why));
    }
    Ok(ConfigScope::Group(name.to_string()))
}

/// Sets and removes dynamic configs at `scope`, answering Kafka's codes: INVALID_REQUEST
/// for a config that cannot change at run time, INVALID_CONFIG for a bad value.
async fn alter_dynamic(
    ctx: &Request,
    scope: &ConfigScope,
    set: BTreeMap<String, String>,
    remove: Vec<String>,
    validate_only: bool,
) -> Result<(), codes::Coded> {
    if let ConfigScope::Group(_) = scope {
        let bounds = ctx.broker().config().groups.consumer;
        for (k, v) in &set {
            bounds.check(k, v).map_err(|e| (codes::INVALID_CONFIG, e))?;
        }
    }
    ctx.broker()
        .alter_dynamic_configs(scope, set, remove, validate_only)
        .await
        .map_err(|e| match e {
            DynamicConfigError::NotDynamic(_) => (
                codes::INVALID_REQUEST,
                format!(
                    "Invalid config value for {}: {e}; Strata reads its other settings from its \
                     config file at start",
                    scope.core()
                ),
            ),
            DynamicConfigError::Invalid(msg) => (codes::INVALID_CONFIG, msg),
        })
}

/// The value a dynamic config has at `scope` before a change: set there, else (brokers)
/// the cluster's dynamic default, the static `[topics.defaults]`, the built-in default.
fn current_dynamic(ctx: &Request, scope: &ConfigScope, name: &str) -> String {
    let broker = ctx.broker();
    if let Some(v) = broker.dynamic_layer(scope).get(name) {
        return v.clone();
    }
    if let ConfigScope::Broker(_) = scope {
        if let Some(v) = broker.dynamic_layer(&ConfigScope::ClusterDefault).get(name) {
            return v.clone();
        }
    }
    match dynamic_config::broker_config(name) {
        Some(BrokerConfig::TopicDefault(t)) => broker
            .config()
            .topic_defaults
            .get(t)
            .cloned()
            .or_else(|| {
                TOPIC_CONFIG_KEYS
                    .iter()
                    .find(|(k, _)| *k == t)
                    .map(|(_, v)| v.to_string())
            })
            .unwrap_or_default(),
        _ => String::new(),
    }
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
        format!("resource type {resource_type} cannot be altered (topics, brokers and groups can)"),
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
                    let set = values_given(&r.configs);
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
                RESOURCE_BROKER | RESOURCE_GROUP => {
                    let set = values_given(&r.configs);
                    let scope = if r.resource_type == RESOURCE_BROKER {
                        broker_scope(&ctx, name, &keys)?
                    } else {
                        group_scope(&ctx, name)?
                    };
                    // the layer becomes exactly what is given: the others are removed
                    let remove: Vec<String> = broker
                        .dynamic_layer(&scope)
                        .into_keys()
                        .filter(|k| !set.contains_key(k))
                        .collect();
                    if r.resource_type == RESOURCE_BROKER {
                        let touched: Vec<&str> = keys
                            .iter()
                            .copied()
                            .chain(remove.iter().map(String::as_str))
                            .collect();
                        broker_scope(&ctx, name, &touched)?;
                    }
                    alter_dynamic(&ctx, &scope, set, remove, req.validate_only).await
                }
                other => Err(unalterable(other)),
            }
        }
        .await;
        responses.push(match outcome {
            Ok(()) => resp.with_error_message(None),
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

/// The values a legacy AlterConfigs gives (a null value sets nothing: the config is left
/// at its default).
fn values_given(
    configs: &[kafka_protocol::messages::alter_configs_request::AlterableConfig],
) -> BTreeMap<String, String> {
    configs
        .iter()
        .filter_map(|c| {
            c.value
                .as_ref()
                .map(|v| (c.name.to_string(), v.to_string()))
        })
        .collect()
}

/// One resource's IncrementalAlterConfigs operations as (set, remove): SET and DELETE as
/// given, APPEND / SUBTRACT applied to `current` of the configs `is_list` takes (others are
/// INVALID_CONFIG, as Kafka answers).
fn incremental_ops(
    configs: &[kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig],
    is_list: impl Fn(&str) -> bool,
    current: impl Fn(&str) -> String,
) -> Result<(BTreeMap<String, String>, Vec<String>), codes::Coded> {
    let mut set = BTreeMap::new();
    let mut remove = Vec::new();
    for c in configs {
        let key = c.name.to_string();
        let value = c.value.as_ref().map(|v| v.to_string()).unwrap_or_default();
        match c.config_operation {
            OP_SET => {
                set.insert(key, value);
            }
            OP_DELETE => remove.push(key),
            op => {
                if !is_list(&key) {
                    let what = if op == OP_APPEND {
                        "append"
                    } else {
                        "subtract"
                    };
                    return Err((
                        codes::INVALID_CONFIG,
                        format!(
                            "Config value {what} is not allowed for config key: {key} (only \
                             list configs: {}, and their broker-level names)",
                            LIST_CONFIGS.join(", ")
                        ),
                    ));
                }
                let new = list_op(&current(&key), &value, op == OP_APPEND);
                set.insert(key, new);
            }
        }
    }
    Ok((set, remove))
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
                    let (set, remove) = incremental_ops(
                        &r.configs,
                        |key| LIST_CONFIGS.contains(&key),
                        |key| effective.get(key).cloned().unwrap_or_default(),
                    )?;
                    broker
                        .alter_topic_configs(name, set, remove, req.validate_only)
                        .await
                        .map_err(|e| codes::admin(&e))
                }
                RESOURCE_BROKER | RESOURCE_GROUP => {
                    let scope = if r.resource_type == RESOURCE_BROKER {
                        broker_scope(&ctx, name, &keys)?
                    } else {
                        group_scope(&ctx, name)?
                    };
                    let (set, remove) = incremental_ops(
                        &r.configs,
                        |key| {
                            matches!(dynamic_config::broker_config(key),
                                Some(BrokerConfig::TopicDefault(t)) if LIST_CONFIGS.contains(&t))
                        },
                        |key| current_dynamic(&ctx, &scope, key),
                    )?;
                    alter_dynamic(&ctx, &scope, set, remove, req.validate_only).await
                }
                other => Err(unalterable(other)),
            }
        }
        .await;
        responses.push(match outcome {
            Ok(()) => resp.with_error_message(None),
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
