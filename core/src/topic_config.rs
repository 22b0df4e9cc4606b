//! Per-topic log configuration under Kafka's names, parsed and validated once: by the
//! controllers before they accept a topic's configs, and by each broker that opens it.

use std::collections::BTreeMap;

use crate::batch::{Compression, Levels};
use std::time::Duration;

/// A topic config key or value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown topic config '{0}'")]
    UnknownKey(String),
    #[error("invalid value '{value}' for topic config '{key}': {reason}")]
    InvalidValue {
        key: String,
        value: String,
        reason: String,
    },
}

/// How appends reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// fsync covers every append before it is acknowledged with acks=all (group commit: many
    /// producers share one fsync). Kafka's `flush.messages=1`.
    EveryAppend,
    /// fsync after this many messages; acknowledgements do not wait for it.
    EveryMessages(u64),
    /// Leave flushing to the OS (Kafka's default `flush.messages` of `i64::MAX`).
    Os,
}

/// Whose clock a record's timestamp is (`message.timestamp.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    /// The producer's timestamps are kept (checked against the timestamp window).
    CreateTime,
    /// The leader stamps each batch with its append time, as Kafka does: the batch's max
    /// timestamp becomes the append time and its timestamp-type attribute is set, so every
    /// record reads as that time (the CRC is recomputed).
    LogAppendTime,
}

/// The validated configuration of one topic's partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub segment_bytes: u64,
    pub segment_ms: Duration,
    /// `None` = keep forever (`retention.ms=-1`).
    pub retention_ms: Option<Duration>,
    /// `None` = no size limit (`retention.bytes=-1`).
    pub retention_bytes: Option<u64>,
    /// `remote.storage.enable`: sealed segments are uploaded to the cold tier, and local
    /// segments are deleted by `local.retention.*` once (and only once) they are uploaded.
    pub remote_storage: bool,
    /// `local.retention.ms` / `local.retention.bytes` (-2, the default, = the total
    /// retention; -1 = no limit): how much stays on local disk when tiered.
    pub local_retention_ms: Option<Duration>,
    pub local_retention_bytes: Option<u64>,
    pub flush: FlushPolicy,
    pub max_message_bytes: u32,
    pub index_interval_bytes: u32,
    pub cleanup_policy: String,
    /// In-sync replicas an acks=all produce needs (enforced with replication).
    pub min_insync_replicas: u16,
    /// Whether a replica outside the ISR may become leader (the controller reads this).
    pub unclean_leader_election: bool,
    /// The weakest acks a producer may ask for (`min.acks`: 0, 1 or all = -1): a settlement
    /// topic set to `all` refuses acks=1 and acks=0 producers with INVALID_REQUIRED_ACKS.
    pub min_acks: i16,
    /// `transactions.required` (Strata's own): only transactional producers may write; a
    /// plain or idempotent producer's batch is refused with INVALID_RECORD.
    pub transactions_required: bool,
    pub timestamp_type: TimestampType,
    /// CreateTime only: a record whose timestamp is more than this many ms before the
    /// broker's clock is refused with INVALID_TIMESTAMP (`message.timestamp.before.max.ms`,
    /// or `message.timestamp.difference.max.ms` when that is left at its default, as Kafka
    /// reads them). `i64::MAX`: no limit.
    pub timestamp_before_max_ms: i64,
    /// Likewise for timestamps ahead of the broker's clock (`message.timestamp.after.max.ms`).
    pub timestamp_after_max_ms: i64,
    /// `max.compaction.lag.ms`: the longest a record may stay uncompacted; a log whose
    /// oldest uncompacted record is older is compacted whatever its dirty ratio.
    pub max_compaction_lag_ms: i64,
    /// `min.compaction.lag.ms`: records younger than this are not compacted yet.
    pub min_compaction_lag_ms: i64,
    /// `delete.retention.ms`: how long a tombstone stays after it is compacted over.
    pub delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio`, in parts per million: the share of a compacted log's
    /// bytes not yet compacted that makes a compaction due.
    pub min_cleanable_dirty_ratio_ppm: u32,
    /// `compression.type`: the codec the leader stores batches in, re-encoding any other;
    /// `None` for `producer` (as the producer compressed them).
    pub compression: Option<Compression>,
    /// `compression.gzip.level`, `compression.lz4.level`, `compression.zstd.level`.
    pub compression_levels: Levels,
}

impl TimestampType {
    /// The accepted window of record timestamps around `now_ms`, `(earliest, latest)`, or
    /// `None` when every timestamp is accepted (LogAppendTime, or no limits).
    pub fn window(config: &LogConfig, now_ms: i64) -> Option<(i64, i64)> {
        if config.timestamp_type == TimestampType::LogAppendTime
            || (config.timestamp_before_max_ms == i64::MAX
                && config.timestamp_after_max_ms == i64::MAX)
        {
            return None;
        }
        Some((
            now_ms.saturating_sub(config.timestamp_before_max_ms),
            now_ms.saturating_add(config.timestamp_after_max_ms),
        ))
    }
}

/// Topic configs this broker knows, with Kafka's defaults except `flush.messages`, which
/// defaults to 1 here: an acknowledged settlement record must survive a power cut.
pub const TOPIC_CONFIG_KEYS: &[(&str, &str)] = &[
    ("cleanup.policy", "delete"),
    ("compression.gzip.level", "-1"),
    ("compression.lz4.level", "9"),
    ("compression.type", "producer"),
    ("compression.zstd.level", "3"),
    ("delete.retention.ms", "86400000"),
    ("file.delete.delay.ms", "60000"),
    ("flush.messages", "1"),
    ("flush.ms", "9223372036854775807"),
    ("follower.replication.throttled.replicas", ""),
    ("index.interval.bytes", "4096"),
    ("leader.replication.throttled.replicas", ""),
    ("local.retention.bytes", "-2"),
    ("local.retention.ms", "-2"),
    ("max.compaction.lag.ms", "9223372036854775807"),
    ("max.message.bytes", "1048588"),
    ("message.downconversion.enable", "true"),
    ("message.format.version", "3.0-IV1"),
    ("message.timestamp.after.max.ms", "9223372036854775807"),
    ("message.timestamp.before.max.ms", "9223372036854775807"),
    ("message.timestamp.difference.max.ms", "9223372036854775807"),
    ("message.timestamp.type", "CreateTime"),
    ("min.acks", "0"),
    ("min.cleanable.dirty.ratio", "0.5"),
    ("min.compaction.lag.ms", "0"),
    ("min.insync.replicas", "1"),
    ("preallocate", "false"),
    ("remote.storage.enable", "false"),
    ("retention.bytes", "-1"),
    ("retention.ms", "604800000"),
    ("segment.bytes", "1073741824"),
    ("segment.index.bytes", "10485760"),
    ("segment.jitter.ms", "0"),
    ("segment.ms", "604800000"),
    ("transactions.required", "false"),
    ("unclean.leader.election.enable", "false"),
];

/// Configs whose value is a comma-separated list (IncrementalAlterConfigs may APPEND to and
/// SUBTRACT from them).
pub const LIST_CONFIGS: &[&str] = &[
    "cleanup.policy",
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
];

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig::from_map(&BTreeMap::new()).expect("built-in defaults are valid")
    }
}

fn int(key: &str, value: &str, min: i64, max: i64) -> Result<i64, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidValue {
        key: key.to_string(),
        value: value.to_string(),
        reason,
    };
    let v: i64 = value
        .trim()
        .parse()
        .map_err(|_| invalid("not an integer".into()))?;
    if v < min || v > max {
        return Err(invalid(format!("must be between {min} and {max}")));
    }
    Ok(v)
}

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// A boolean as Kafka parses one: `true` or `false`, any case.
fn boolean(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim() {
        v if v.eq_ignore_ascii_case("true") => Ok(true),
        v if v.eq_ignore_ascii_case("false") => Ok(false),
        _ => Err(invalid(key, value, "must be true or false")),
    }
}

/// One of a fixed set of values (Kafka's `ValidString`: exact, case-sensitive).
fn one_of<'a>(key: &str, value: &'a str, allowed: &[&str]) -> Result<&'a str, ConfigError> {
    let v = value.trim();
    if allowed.contains(&v) {
        Ok(v)
    } else {
        Err(invalid(
            key,
            value,
            format!("must be one of {}", allowed.join(", ")),
        ))
    }
}

/// `leader.replication.throttled.replicas` / `follower...`: `*`, or a comma-separated list of
/// `partition:broker` pairs (Kafka's `ThrottledReplicaListValidator`); empty is allowed.
fn throttled_replicas(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.trim() == "*" {
        return Ok(());
    }
    let pair = |p: &str| {
        p.split_once(':').is_some_and(|(a, b)| {
            !a.trim().is_empty()
                && !b.trim().is_empty()
                && a.trim().bytes().all(|c| c.is_ascii_digit())
                && b.trim().bytes().all(|c| c.is_ascii_digit())
        })
    };
    if value.trim().is_empty() || value.split(',').all(|p| pair(p.trim())) {
        return Ok(());
    }
    Err(invalid(
        key,
        value,
        "must be * or a comma-separated list of partition:broker pairs, e.g. 0:1,1:2",
    ))
}

/// `message.format.version`: a Kafka version such as `0.10.2`, `2.8` or `3.0-IV1`
/// (deprecated in Kafka 3.0, which ignores it as Strata does).
fn format_version(value: &str) -> Result<(), ConfigError> {
    let v = value.trim();
    let (version, iv) = match v.split_once("-IV") {
        Some((version, iv)) => (version, Some(iv)),
        None => (v, None),
    };
    let parts: Vec<&str> = version.split('.').collect();
    let number = |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit());
    let ok =
        (2..=3).contains(&parts.len()) && parts.iter().all(|p| number(p)) && iv.is_none_or(number);
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "message.format.version",
            value,
            "must be a Kafka version such as 2.8 or 3.0-IV1",
        ))
    }
}

/// `cleanup.policy`: `delete`, `compact` or both (comma-separated, any order), normalized.
/// A tiered topic is compacted in the cold tier (strata-compactor), one that is not by its
/// brokers, each replica its own local log.
fn cleanup_policy(value: &str) -> Result<String, ConfigError> {
    let (mut compact, mut delete) = (false, false);
    for p in value.split(',').map(str::trim) {
        match p {
            "compact" => compact = true,
            "delete" => delete = true,
            _ => {
                return Err(ConfigError::InvalidValue {
                    key: "cleanup.policy".into(),
                    value: value.to_string(),
                    reason: "must be delete, compact, or compact,delete".into(),
                })
            }
        }
    }
    Ok(match (compact, delete) {
        (true, true) => "compact,delete",
        (true, false) => "compact",
        _ => "delete",
    }
    .to_string())
}

impl LogConfig {
    /// Builds a config from Kafka-named overrides; keys not given take the defaults of
    /// [`TOPIC_CONFIG_KEYS`].
    pub fn from_map(overrides: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        for key in overrides.keys() {
            if !TOPIC_CONFIG_KEYS.iter().any(|(k, _)| k == key) {
                return Err(ConfigError::UnknownKey(key.clone()));
            }
        }
        let get = |key: &str| -> &str {
            overrides.get(key).map(String::as_str).unwrap_or_else(|| {
                TOPIC_CONFIG_KEYS
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| *v)
                    .expect("key listed in TOPIC_CONFIG_KEYS")
            })
        };
        let cleanup_policy = cleanup_policy(get("cleanup.policy"))?;
        // Compaction settings (the brokers' and strata-compactor's): checked here so a bad
        // value is refused when the topic is created, not found later.
        let delete_retention_ms = int(
            "delete.retention.ms",
            get("delete.retention.ms"),
            0,
            i64::MAX,
        )?;
        let ratio = get("min.cleanable.dirty.ratio");
        let Some(ratio_value) = ratio
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
        else {
            return Err(ConfigError::InvalidValue {
                key: "min.cleanable.dirty.ratio".into(),
                value: ratio.to_string(),
                reason: "must be a number between 0 and 1".into(),
            });
        };
        // A topic that is only compacted keeps records whatever their age or size (Kafka's
        // rule): retention.ms and retention.bytes apply with `delete` only.
        let deletes = cleanup_policy.split(',').any(|p| p == "delete");
        let retention_ms = match deletes {
            true => int("retention.ms", get("retention.ms"), -1, i64::MAX)?,
            false => -1,
        };
        let retention_bytes = match deletes {
            true => int("retention.bytes", get("retention.bytes"), -1, i64::MAX)?,
            false => -1,
        };
        let flush_messages = int("flush.messages", get("flush.messages"), 1, i64::MAX)?;
        let local_ms = int(
            "local.retention.ms",
            get("local.retention.ms"),
            -2,
            i64::MAX,
        )?;
        let local_bytes = int(
            "local.retention.bytes",
            get("local.retention.bytes"),
            -2,
            i64::MAX,
        )?;
        // Accepted with Kafka's types and ranges; what each does (or why it does nothing)
        // in Strata is in docs/kafka-compatibility.md.
        one_of(
            "compression.type",
            get("compression.type"),
            &["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"],
        )?;
        let compression = match get("compression.type").trim() {
            "uncompressed" => Some(Compression::None),
            "gzip" => Some(Compression::Gzip),
            "snappy" => Some(Compression::Snappy),
            "lz4" => Some(Compression::Lz4),
            "zstd" => Some(Compression::Zstd),
            _ => None,
        };
        let gzip_level = get("compression.gzip.level");
        let gzip = int("compression.gzip.level", gzip_level, -1, 9)?;
        if gzip == 0 {
            return Err(invalid(
                "compression.gzip.level",
                gzip_level,
                "must be -1 (the codec's default) or between 1 and 9",
            ));
        }
        let compression_levels = Levels {
            gzip: gzip as i32,
            lz4: int("compression.lz4.level", get("compression.lz4.level"), 1, 17)? as u32,
            zstd: int(
                "compression.zstd.level",
                get("compression.zstd.level"),
                -131072,
                22,
            )? as i32,
        };
        int(
            "file.delete.delay.ms",
            get("file.delete.delay.ms"),
            0,
            i64::MAX,
        )?;
        int("flush.ms", get("flush.ms"), 0, i64::MAX)?;
        for key in [
            "follower.replication.throttled.replicas",
            "leader.replication.throttled.replicas",
        ] {
            throttled_replicas(key, get(key))?;
        }
        boolean(
            "message.downconversion.enable",
            get("message.downconversion.enable"),
        )?;
        format_version(get("message.format.version"))?;
        boolean("preallocate", get("preallocate"))?;
        int(
            "segment.index.bytes",
            get("segment.index.bytes"),
            4,
            i32::MAX as i64,
        )?;
        int("segment.jitter.ms", get("segment.jitter.ms"), 0, i64::MAX)?;
        let min_lag = int(
            "min.compaction.lag.ms",
            get("min.compaction.lag.ms"),
            0,
            i64::MAX,
        )?;
        let max_lag = int(
            "max.compaction.lag.ms",
            get("max.compaction.lag.ms"),
            1,
            i64::MAX,
        )?;
        if min_lag > max_lag {
            return Err(invalid(
                "max.compaction.lag.ms",
                get("max.compaction.lag.ms"),
                format!("must not be below min.compaction.lag.ms ({min_lag})"),
            ));
        }
        let timestamp_type = match one_of(
            "message.timestamp.type",
            get("message.timestamp.type"),
            &["CreateTime", "LogAppendTime"],
        )? {
            "LogAppendTime" => TimestampType::LogAppendTime,
            _ => TimestampType::CreateTime,
        };
        let ms = |key: &str| int(key, get(key), 0, i64::MAX);
        let difference = ms("message.timestamp.difference.max.ms")?;
        // Kafka 3.6+ (KIP-937): before/after take the deprecated difference when left at
        // their defaults.
        let before = match ms("message.timestamp.before.max.ms")? {
            i64::MAX => difference,
            v => v,
        };
        let after = match ms("message.timestamp.after.max.ms")? {
            i64::MAX => difference,
            v => v,
        };
        let retention_ms = (retention_ms >= 0).then(|| Duration::from_millis(retention_ms as u64));
        let retention_bytes = (retention_bytes >= 0).then_some(retention_bytes as u64);
        Ok(LogConfig {
            segment_bytes: int("segment.bytes", get("segment.bytes"), 14, i32::MAX as i64)? as u64,
            segment_ms: Duration::from_millis(
                int("segment.ms", get("segment.ms"), 1, i64::MAX)? as u64
            ),
            retention_ms,
            retention_bytes,
            remote_storage: match get("remote.storage.enable").trim() {
                "true" => true,
                "false" => false,
                other => {
                    return Err(ConfigError::InvalidValue {
                        key: "remote.storage.enable".into(),
                        value: other.to_string(),
                        reason: "must be true or false".into(),
                    })
                }
            },
            local_retention_ms: match local_ms {
                -2 => retention_ms,
                -1 => None,
                ms => Some(Duration::from_millis(ms as u64)),
            },
            local_retention_bytes: match local_bytes {
                -2 => retention_bytes,
                -1 => None,
                b => Some(b as u64),
            },
            flush: match flush_messages {
                1 => FlushPolicy::EveryAppend,
                i64::MAX => FlushPolicy::Os,
                n => FlushPolicy::EveryMessages(n as u64),
            },
            max_message_bytes: int(
                "max.message.bytes",
                get("max.message.bytes"),
                0,
                i32::MAX as i64,
            )? as u32,
            index_interval_bytes: int(
                "index.interval.bytes",
                get("index.interval.bytes"),
                0,
                i32::MAX as i64,
            )? as u32,
            cleanup_policy,
            min_insync_replicas: int(
                "min.insync.replicas",
                get("min.insync.replicas"),
                1,
                i16::MAX as i64,
            )? as u16,
            min_acks: match get("min.acks").trim() {
                "0" => 0,
                "1" => 1,
                "all" | "-1" => -1,
                other => {
                    return Err(ConfigError::InvalidValue {
                        key: "min.acks".into(),
                        value: other.to_string(),
                        reason: "must be 0, 1 or all".into(),
                    })
                }
            },
            transactions_required: match get("transactions.required").trim() {
                "true" => true,
                "false" => false,
                other => {
                    return Err(ConfigError::InvalidValue {
                        key: "transactions.required".into(),
                        value: other.to_string(),
                        reason: "must be true or false".into(),
                    })
                }
            },
            unclean_leader_election: match get("unclean.leader.election.enable").trim() {
                "true" => true,
                "false" => false,
                other => {
                    return Err(ConfigError::InvalidValue {
                        key: "unclean.leader.election.enable".into(),
                        value: other.to_string(),
                        reason: "must be true or false".into(),
                    })
                }
            },
            timestamp_type,
            timestamp_before_max_ms: before,
            timestamp_after_max_ms: after,
            max_compaction_lag_ms: max_lag,
            min_compaction_lag_ms: min_lag,
            delete_retention_ms,
            min_cleanable_dirty_ratio_ppm: (ratio_value * 1e6).round() as u32,
            compression,
            compression_levels,
        })
    }

    /// `cleanup.policy` holds `compact`: the log keeps the latest record of each key.
    pub fn compacted(&self) -> bool {
        self.cleanup_policy.split(',').any(|p| p == "compact")
    }

    /// Whether a producer asking for `acks` meets `min.acks` (-1, all, is the strongest).
    pub fn accepts_acks(&self, acks: i16) -> bool {
        Self::accepts(self.min_acks, acks)
    }

    /// Whether `acks` is at least as strong as `min_acks`.
    pub fn accepts(min_acks: i16, acks: i16) -> bool {
        let strength = |a: i16| if a == -1 { 2 } else { a };
        strength(acks) >= strength(min_acks)
    }

    /// Whether a record is visible to consumers and `acks=all` only once it is fsynced.
    pub fn acks_wait_for_fsync(&self) -> bool {
        self.flush == FlushPolicy::EveryAppend
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_kafkas_but_fsync() {
        let c = LogConfig::default();
        assert_eq!(c.segment_bytes, 1 << 30);
        assert_eq!(c.retention_ms, Some(Duration::from_secs(7 * 24 * 3600)));
        assert_eq!(c.retention_bytes, None);
        assert_eq!(c.flush, FlushPolicy::EveryAppend);
    }

    #[test]
    fn overrides_parse_and_bad_values_are_refused() {
        let c = LogConfig::from_map(&map(&[
            ("retention.ms", "-1"),
            ("flush.messages", "9223372036854775807"),
        ]))
        .unwrap();
        assert_eq!(c.retention_ms, None);
        assert_eq!(c.flush, FlushPolicy::Os);
        assert_eq!(
            LogConfig::from_map(&map(&[("segment.bytes", "ten")])),
            Err(ConfigError::InvalidValue {
                key: "segment.bytes".into(),
                value: "ten".into(),
                reason: "not an integer".into()
            })
        );
        assert_eq!(
            LogConfig::from_map(&map(&[("no.such", "1")])),
            Err(ConfigError::UnknownKey("no.such".into()))
        );
        assert!(LogConfig::from_map(&map(&[("flush.messages", "0")])).is_err());
    }

    #[test]
    fn compaction_settings_are_checked_and_compact_alone_ignores_retention() {
        let c = LogConfig::from_map(&map(&[
            ("cleanup.policy", "compact"),
            ("retention.ms", "1000"),
        ]))
        .unwrap();
        assert_eq!(c.cleanup_policy, "compact");
        assert_eq!(
            c.retention_ms, None,
            "a compact-only topic keeps old records"
        );
        let both = LogConfig::from_map(&map(&[
            ("cleanup.policy", "delete, compact"),
            ("retention.ms", "1000"),
            ("delete.retention.ms", "0"),
            ("min.cleanable.dirty.ratio", "0.1"),
        ]))
        .unwrap();
        assert_eq!(both.cleanup_policy, "compact,delete");
        assert_eq!(both.retention_ms, Some(Duration::from_secs(1)));
        for bad in [
            ("cleanup.policy", "shred"),
            ("cleanup.policy", ""),
            ("delete.retention.ms", "-5"),
            ("min.cleanable.dirty.ratio", "1.5"),
            ("min.compaction.lag.ms", "soon"),
        ] {
            assert!(LogConfig::from_map(&map(&[bad])).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn min_acks_orders_all_above_one_above_zero() {
        let all = LogConfig::from_map(&map(&[("min.acks", "all")])).unwrap();
        assert!(all.accepts_acks(-1));
        assert!(!all.accepts_acks(1));
        assert!(!all.accepts_acks(0));
        let one = LogConfig::from_map(&map(&[("min.acks", "1")])).unwrap();
        assert!(one.accepts_acks(-1) && one.accepts_acks(1) && !one.accepts_acks(0));
        assert!(LogConfig::default().accepts_acks(0));
        assert!(LogConfig::from_map(&map(&[("min.acks", "2")])).is_err());
    }

    #[test]
    fn kafkas_standard_topic_configs_are_accepted_with_their_ranges() {
        let every: Vec<(&str, &str)> = vec![
            ("compression.type", "zstd"),
            ("compression.gzip.level", "9"),
            ("compression.lz4.level", "17"),
            ("compression.zstd.level", "-131072"),
            ("file.delete.delay.ms", "0"),
            ("flush.ms", "1000"),
            ("follower.replication.throttled.replicas", "*"),
            ("leader.replication.throttled.replicas", "0:1, 1:2"),
            ("max.compaction.lag.ms", "60000"),
            ("message.downconversion.enable", "FALSE"),
            ("message.format.version", "0.10.2-IV0"),
            ("message.timestamp.type", "LogAppendTime"),
            ("message.timestamp.difference.max.ms", "0"),
            ("preallocate", "true"),
            ("segment.index.bytes", "4"),
            ("segment.jitter.ms", "5"),
            ("segment.ms", "1"),
        ];
        let c = LogConfig::from_map(&map(&every)).unwrap();
        assert_eq!(c.timestamp_type, TimestampType::LogAppendTime);
        assert_eq!(c.max_compaction_lag_ms, 60000);
        for bad in [
            ("compression.type", "brotli"),
            ("compression.type", "GZIP"),
            ("compression.gzip.level", "0"),
            ("compression.gzip.level", "10"),
            ("compression.lz4.level", "0"),
            ("compression.zstd.level", "23"),
            ("file.delete.delay.ms", "-1"),
            ("flush.ms", "-1"),
            ("follower.replication.throttled.replicas", "0-1"),
            ("leader.replication.throttled.replicas", "a:1"),
            ("leader.replication.throttled.replicas", "0:1,"),
            ("max.compaction.lag.ms", "0"),
            ("message.downconversion.enable", "yes"),
            ("message.format.version", "banana"),
            ("message.format.version", "3"),
            ("message.timestamp.type", "logappendtime"),
            ("message.timestamp.before.max.ms", "-1"),
            ("message.timestamp.after.max.ms", "x"),
            ("preallocate", "1"),
            ("segment.index.bytes", "3"),
            ("segment.jitter.ms", "-1"),
            ("segment.ms", "0"),
        ] {
            match LogConfig::from_map(&map(&[bad])) {
                Err(ConfigError::InvalidValue { key, .. }) => assert_eq!(key, bad.0),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        // Kafka refuses a minimum compaction lag above the maximum.
        assert!(LogConfig::from_map(&map(&[
            ("min.compaction.lag.ms", "10"),
            ("max.compaction.lag.ms", "5"),
        ]))
        .is_err());
    }

    #[test]
    fn the_timestamp_window_follows_kip_937() {
        let window = |pairs: &[(&str, &str)]| {
            TimestampType::window(&LogConfig::from_map(&map(pairs)).unwrap(), 1_000_000)
        };
        assert_eq!(window(&[]), None, "no limits by default");
        // the deprecated difference applies both ways when before/after are left alone
        assert_eq!(
            window(&[("message.timestamp.difference.max.ms", "100")]),
            Some((999_900, 1_000_100))
        );
        // an explicit before/after wins over the difference
        assert_eq!(
            window(&[
                ("message.timestamp.difference.max.ms", "100"),
                ("message.timestamp.before.max.ms", "5000"),
            ]),
            Some((995_000, 1_000_100))
        );
        assert_eq!(
            window(&[("message.timestamp.after.max.ms", "10")]),
            Some((1_000_000 - i64::MAX, 1_000_010))
        );
        // LogAppendTime replaces the producer's timestamps: nothing to check
        assert_eq!(
            window(&[
                ("message.timestamp.type", "LogAppendTime"),
                ("message.timestamp.difference.max.ms", "100"),
            ]),
            None
        );
    }
}
