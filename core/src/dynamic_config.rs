//! Configs an operator changes at run time, kept in the metadata log (Kafka's dynamic
//! configs): a broker's, set for one broker or as the cluster-wide default, and a consumer
//! group's (KIP-848 group configs). This module says which names are dynamic and what
//! values they take; the controllers check every change with it before it enters the log,
//! and the brokers read the same rules.
//!
//! Broker configs come in two kinds:
//! - topic defaults under Kafka's broker-level names (`log.retention.ms` is the default of
//!   `retention.ms`): they apply to every topic that has no value of its own, in Kafka's
//!   order — the topic's own, this broker's dynamic value, the cluster's dynamic default,
//!   the static `[topics.defaults]`, the built-in default;
//! - Kafka's other dynamic broker configs (thread pools, connection limits, Kerberos):
//!   accepted and stored so that Kafka's tools work, described with what they do here
//!   (nothing, as each entry's text says).

use std::collections::BTreeMap;

use crate::topic_config::LogConfig;

/// Each topic config that has a broker-level default, with Kafka's name for that default.
pub const BROKER_SYNONYMS: &[(&str, &str)] = &[
    ("cleanup.policy", "log.cleanup.policy"),
    ("compression.gzip.level", "compression.gzip.level"),
    ("compression.lz4.level", "compression.lz4.level"),
    ("compression.type", "compression.type"),
    ("compression.zstd.level", "compression.zstd.level"),
    ("delete.retention.ms", "log.cleaner.delete.retention.ms"),
    ("file.delete.delay.ms", "log.segment.delete.delay.ms"),
    ("flush.messages", "log.flush.interval.messages"),
    ("flush.ms", "log.flush.interval.ms"),
    ("index.interval.bytes", "log.index.interval.bytes"),
    ("local.retention.bytes", "log.local.retention.bytes"),
    ("local.retention.ms", "log.local.retention.ms"),
    ("max.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms"),
    ("max.message.bytes", "message.max.bytes"),
    (
        "message.downconversion.enable",
        "log.message.downconversion.enable",
    ),
    ("message.format.version", "log.message.format.version"),
    (
        "message.timestamp.after.max.ms",
        "log.message.timestamp.after.max.ms",
    ),
    (
        "message.timestamp.before.max.ms",
        "log.message.timestamp.before.max.ms",
    ),
    (
        "message.timestamp.difference.max.ms",
        "log.message.timestamp.difference.max.ms",
    ),
    ("message.timestamp.type", "log.message.timestamp.type"),
    (
        "min.cleanable.dirty.ratio",
        "log.cleaner.min.cleanable.ratio",
    ),
    ("min.compaction.lag.ms", "log.cleaner.min.compaction.lag.ms"),
    ("min.insync.replicas", "min.insync.replicas"),
    ("preallocate", "log.preallocate"),
    ("retention.bytes", "log.retention.bytes"),
    ("retention.ms", "log.retention.ms"),
    ("segment.bytes", "log.segment.bytes"),
    ("segment.index.bytes", "log.index.size.max.bytes"),
    ("segment.jitter.ms", "log.roll.jitter.ms"),
    ("segment.ms", "log.roll.ms"),
    (
        "unclean.leader.election.enable",
        "unclean.leader.election.enable",
    ),
];

/// Kafka's broker-level name of a topic config's default, if it has one.
pub fn broker_name_of(topic_key: &str) -> Option<&'static str> {
    BROKER_SYNONYMS
        .iter()
        .find(|(t, _)| *t == topic_key)
        .map(|(_, b)| *b)
}

/// The value type of a stored-only config, for checking what is set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueType {
    Int { min: i64, max: i64 },
    Double { min: f64, max: f64 },
    Text,
}

/// A dynamic config that Strata stores and describes but that changes nothing here.
#[derive(Debug, Clone, Copy)]
pub struct StoredOnly {
    pub name: &'static str,
    pub value_type: ValueType,
    /// Kafka's default, as DescribeConfigs shows it when nothing is set.
    pub default: Option<&'static str>,
    /// Settable only for one broker, not as the cluster-wide default (Kafka's per-broker
    /// listener configs).
    pub per_broker_only: bool,
    pub doc: &'static str,
}

const fn stored(
    name: &'static str,
    value_type: ValueType,
    default: Option<&'static str>,
    doc: &'static str,
) -> StoredOnly {
    StoredOnly {
        name,
        value_type,
        default,
        per_broker_only: false,
        doc,
    }
}

const fn per_broker(
    name: &'static str,
    value_type: ValueType,
    default: Option<&'static str>,
    doc: &'static str,
) -> StoredOnly {
    StoredOnly {
        per_broker_only: true,
        ..stored(name, value_type, default, doc)
    }
}

const THREADS: ValueType = ValueType::Int {
    min: 1,
    max: i32::MAX as i64,
};
const COUNT: ValueType = ValueType::Int {
    min: 0,
    max: i32::MAX as i64,
};
const RATE: ValueType = ValueType::Int {
    min: 0,
    max: i64::MAX,
};
const NO_THREAD_POOL: &str =
    "Accepted and stored; Strata runs on one async runtime with a thread per core, so no effect";
const NO_KERBEROS: &str = "Accepted and stored; Strata has no Kerberos (GSSAPI), so no effect";

/// Kafka's dynamic broker configs that are not topic defaults, as Strata takes them.
pub const STORED_ONLY_BROKER_CONFIGS: &[StoredOnly] = &[
    stored("background.threads", THREADS, Some("10"), NO_THREAD_POOL),
    stored("log.cleaner.threads", COUNT, Some("1"), NO_THREAD_POOL),
    stored(
        "log.cleaner.io.max.bytes.per.second",
        ValueType::Double {
            min: 0.0,
            max: f64::MAX,
        },
        Some("1.7976931348623157E308"),
        "Accepted and stored; the brokers' compaction is not rate-limited, so no effect",
    ),
    stored(
        "max.connection.creation.rate",
        COUNT,
        Some("2147483647"),
        "Accepted and stored; Strata limits connections per listener ([kafka] max_connections), so no effect",
    ),
    stored(
        "max.connections",
        COUNT,
        Some("2147483647"),
        "Accepted and stored; Strata limits connections per listener ([kafka] max_connections), so no effect",
    ),
    stored(
        "max.connections.per.ip",
        COUNT,
        Some("2147483647"),
        "Accepted and stored; Strata limits connections per listener ([kafka] max_connections), so no effect",
    ),
    stored("num.io.threads", THREADS, Some("8"), NO_THREAD_POOL),
    stored("num.network.threads", THREADS, Some("3"), NO_THREAD_POOL),
    stored(
        "num.recovery.threads.per.data.dir",
        THREADS,
        Some("2"),
        NO_THREAD_POOL,
    ),
    stored("num.replica.fetchers", THREADS, Some("1"), NO_THREAD_POOL),
    stored(
        "follower.replication.throttled.rate",
        RATE,
        Some("9223372036854775807"),
        "Accepted and stored; a reassignment's copy rate is set with it (strata topic reassign --throttle), so no effect",
    ),
    stored(
        "leader.replication.throttled.rate",
        RATE,
        Some("9223372036854775807"),
        "Accepted and stored; a reassignment's copy rate is set with it (strata topic reassign --throttle), so no effect",
    ),
    per_broker(
        "sasl.kerberos.kinit.cmd",
        ValueType::Text,
        Some("/usr/bin/kinit"),
        NO_KERBEROS,
    ),
    per_broker(
        "sasl.kerberos.min.time.before.relogin",
        RATE,
        Some("60000"),
        NO_KERBEROS,
    ),
    per_broker(
        "sasl.kerberos.principal.to.local.rules",
        ValueType::Text,
        Some("DEFAULT"),
        NO_KERBEROS,
    ),
    per_broker("sasl.kerberos.service.name", ValueType::Text, None, NO_KERBEROS),
    per_broker(
        "sasl.kerberos.ticket.renew.jitter",
        ValueType::Double { min: 0.0, max: 1.0 },
        Some("0.05"),
        NO_KERBEROS,
    ),
    per_broker(
        "sasl.kerberos.ticket.renew.window.factor",
        ValueType::Double { min: 0.0, max: 1.0 },
        Some("0.8"),
        NO_KERBEROS,
    ),
];

/// What a broker config name is, dynamically.
#[derive(Debug, Clone, Copy)]
pub enum BrokerConfig {
    /// The default of this topic config.
    TopicDefault(&'static str),
    StoredOnly(&'static StoredOnly),
}

/// The dynamic broker config of this name, or `None` when it cannot change at run time
/// (Strata reads it from its config file) or is unknown.
pub fn broker_config(name: &str) -> Option<BrokerConfig> {
    if let Some(s) = STORED_ONLY_BROKER_CONFIGS.iter().find(|s| s.name == name) {
        return Some(BrokerConfig::StoredOnly(s));
    }
    BROKER_SYNONYMS
        .iter()
        // deprecated in Kafka 3.0 and not dynamic there either
        .filter(|(_, b)| *b != "log.message.format.version")
        .find(|(_, b)| *b == name)
        .map(|(t, _)| BrokerConfig::TopicDefault(t))
}

/// A consumer group config (KIP-848): the values the metadata log takes and Kafka's default.
/// Each broker checks a new value against its own `group.consumer.{min,max}.*` bounds
/// before it asks for the change, and keeps values within them when it applies them.
#[derive(Debug, Clone, Copy)]
pub struct GroupConfig {
    pub name: &'static str,
    pub min: i64,
    pub max: i64,
    pub default: i64,
    pub doc: &'static str,
}

pub const GROUP_CONFIGS: &[GroupConfig] = &[
    GroupConfig {
        name: "consumer.heartbeat.interval.ms",
        min: 1,
        max: i32::MAX as i64,
        default: 5_000,
        doc: "Heartbeat interval of the group's members on the consumer protocol (KIP-848), within the broker's group.consumer.min/max.heartbeat.interval.ms ([groups] consumer_min_heartbeat_interval, consumer_max_heartbeat_interval); classic members keep their own setting",
    },
    GroupConfig {
        name: "consumer.session.timeout.ms",
        min: 1,
        max: i32::MAX as i64,
        default: 45_000,
        doc: "Session timeout of the group's members on the consumer protocol (KIP-848), within the broker's group.consumer.min/max.session.timeout.ms ([groups] consumer_min_session_timeout, consumer_max_session_timeout); classic members keep their own setting",
    },
];

/// Where a dynamic config applies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Every broker that has no value of its own (Kafka's broker resource named "").
    ClusterDefault,
    Broker(i32),
    Group(String),
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::ClusterDefault => write!(f, "the cluster-wide broker default"),
            Scope::Broker(id) => write!(f, "broker {id}"),
            Scope::Group(g) => write!(f, "group '{g}'"),
        }
    }
}

/// Longest config value accepted (a metadata entry's size is never the client's choice).
pub const MAX_VALUE_BYTES: usize = 4096;

/// Why a dynamic config change cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DynamicConfigError {
    /// The name cannot change at run time here (Kafka answers INVALID_REQUEST).
    #[error("Cannot update these configs dynamically: {0}")]
    NotDynamic(String),
    /// Known and dynamic, but not at this scope, or the value is wrong (INVALID_CONFIG).
    #[error("{0}")]
    Invalid(String),
}

fn check_value(name: &str, value: &str, t: ValueType) -> Result<(), DynamicConfigError> {
    let bad = |why: String| {
        Err(DynamicConfigError::Invalid(format!(
            "invalid value '{value}' for config '{name}': {why}"
        )))
    };
    match t {
        ValueType::Int { min, max } => match value.trim().parse::<i64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(()),
            Ok(_) => bad(format!("must be between {min} and {max}")),
            Err(_) => bad("not an integer".into()),
        },
        ValueType::Double { min, max } => match value.trim().parse::<f64>() {
            Ok(v) if v >= min && v <= max => Ok(()),
            Ok(_) => bad(format!("must be between {min} and {max}")),
            Err(_) => bad("not a number".into()),
        },
        ValueType::Text if value.chars().any(char::is_control) => {
            bad("control characters are not allowed".into())
        }
        ValueType::Text => Ok(()),
    }
}

/// Checks that every name can change at run time at `scope` and that no value is longer
/// than [`MAX_VALUE_BYTES`]; [`check_layer`] checks the values themselves.
pub fn check_names<'a>(
    scope: &Scope,
    set: impl IntoIterator<Item = (&'a String, &'a String)> + Clone,
) -> Result<(), DynamicConfigError> {
    if let Some((k, v)) = set
        .clone()
        .into_iter()
        .find(|(_, v)| v.len() > MAX_VALUE_BYTES)
    {
        return Err(DynamicConfigError::Invalid(format!(
            "the value of config '{k}' has {} bytes; at most {MAX_VALUE_BYTES}",
            v.len()
        )));
    }
    if let Scope::Group(_) = scope {
        let unknown: Vec<&str> = set
            .into_iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| !GROUP_CONFIGS.iter().any(|g| g.name == *k))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        return Err(DynamicConfigError::Invalid(format!(
            "unknown group configs: {} (group configs: {})",
            unknown.join(", "),
            GROUP_CONFIGS
                .iter()
                .map(|g| g.name)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut not_dynamic = Vec::new();
    for (k, _) in set {
        match broker_config(k) {
            None => not_dynamic.push(k.as_str()),
            Some(BrokerConfig::StoredOnly(s))
                if s.per_broker_only && *scope == Scope::ClusterDefault =>
            {
                return Err(DynamicConfigError::Invalid(format!(
                    "cannot set '{k}' as the cluster-wide default: it is set per broker \
                     (name the broker id)"
                )));
            }
            Some(_) => {}
        }
    }
    if not_dynamic.is_empty() {
        Ok(())
    } else {
        Err(DynamicConfigError::NotDynamic(not_dynamic.join(", ")))
    }
}

/// Checks a whole layer of configs for `scope`, as it would be stored: every name dynamic
/// at that scope, every value valid, and the topic defaults valid together (checked as a
/// topic's configs would be).
pub fn check_layer(
    scope: &Scope,
    layer: &BTreeMap<String, String>,
) -> Result<(), DynamicConfigError> {
    check_names(scope, layer)?;
    let mut topic_defaults = BTreeMap::new();
    for (k, v) in layer {
        if let Some(g) = GROUP_CONFIGS.iter().find(|g| g.name == k) {
            check_value(
                k,
                v,
                ValueType::Int {
                    min: g.min,
                    max: g.max,
                },
            )?;
            continue;
        }
        match broker_config(k).expect("checked by check_names") {
            BrokerConfig::StoredOnly(s) => check_value(k, v, s.value_type)?,
            BrokerConfig::TopicDefault(t) => {
                topic_defaults.insert(t.to_string(), v.clone());
            }
        }
    }
    LogConfig::from_map(&topic_defaults).map_err(|e| {
        let mut msg = e.to_string();
        // name the broker-level config the operator set, not the topic config
        for (t, b) in BROKER_SYNONYMS {
            let quoted = format!("topic config '{t}'");
            if msg.contains(&quoted) {
                msg = msg.replace(&quoted, &format!("config '{b}'"));
                break;
            }
        }
        DynamicConfigError::Invalid(msg)
    })?;
    Ok(())
}

/// The topic defaults a layer of broker configs sets, under the topic configs' names.
pub fn topic_defaults(layer: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    layer
        .iter()
        .filter_map(|(k, v)| match broker_config(k)? {
            BrokerConfig::TopicDefault(t) => Some((t.to_string(), v.clone())),
            BrokerConfig::StoredOnly(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_synonym_names_a_topic_config_and_is_found_both_ways() {
        for (t, b) in BROKER_SYNONYMS {
            assert!(
                crate::topic_config::TOPIC_CONFIG_KEYS
                    .iter()
                    .any(|(k, _)| k == t),
                "{t} is not a topic config"
            );
            assert_eq!(broker_name_of(t), Some(*b));
        }
        assert!(matches!(
            broker_config("log.retention.ms"),
            Some(BrokerConfig::TopicDefault("retention.ms"))
        ));
        assert!(broker_config("log.message.format.version").is_none());
        assert!(broker_config("broker.id").is_none());
    }

    #[test]
    fn a_layer_is_checked_name_by_name_and_value_by_value() {
        let b = Scope::Broker(1);
        assert_eq!(
            check_layer(
                &b,
                &layer(&[
                    ("log.cleanup.policy", "compact"),
                    ("background.threads", "9")
                ])
            ),
            Ok(())
        );
        assert_eq!(
            check_layer(&b, &layer(&[("broker.id", "7"), ("log.dirs", "/x")])),
            Err(DynamicConfigError::NotDynamic("broker.id, log.dirs".into()))
        );
        let Err(DynamicConfigError::Invalid(msg)) =
            check_layer(&b, &layer(&[("log.retention.ms", "soon")]))
        else {
            panic!("a bad retention was taken");
        };
        assert!(msg.contains("'log.retention.ms'"), "{msg}");
        assert!(check_layer(&b, &layer(&[("background.threads", "0")])).is_err());
        assert!(check_layer(&b, &layer(&[("sasl.kerberos.ticket.renew.jitter", "2")])).is_err());
        let long = "x".repeat(MAX_VALUE_BYTES + 1);
        assert!(check_layer(&b, &layer(&[("sasl.kerberos.service.name", &long)])).is_err());
        assert!(check_layer(&b, &layer(&[("log.cleanup.policy", &long)])).is_err());
    }

    #[test]
    fn listener_configs_are_per_broker_only() {
        let kerberos = layer(&[("sasl.kerberos.min.time.before.relogin", "58000")]);
        assert_eq!(check_layer(&Scope::Broker(0), &kerberos), Ok(()));
        assert!(check_layer(&Scope::ClusterDefault, &kerberos).is_err());
        assert_eq!(
            check_layer(
                &Scope::ClusterDefault,
                &layer(&[("log.retention.ms", "1000")])
            ),
            Ok(())
        );
    }

    #[test]
    fn group_configs_are_positive_numbers() {
        let g = Scope::Group("g".into());
        assert_eq!(
            check_layer(&g, &layer(&[("consumer.session.timeout.ms", "50000")])),
            Ok(())
        );
        assert!(check_layer(&g, &layer(&[("consumer.session.timeout.ms", "0")])).is_err());
        assert!(check_layer(&g, &layer(&[("consumer.heartbeat.interval.ms", "soon")])).is_err());
        assert!(check_layer(&g, &layer(&[("log.retention.ms", "1000")])).is_err());
    }

    #[test]
    fn topic_defaults_come_under_topic_names() {
        let l = layer(&[("log.retention.ms", "5000"), ("background.threads", "4")]);
        assert_eq!(topic_defaults(&l), layer(&[("retention.ms", "5000")]));
    }
}
