//! Per-topic log configuration under Kafka's names, parsed and validated once: by the
//! controllers before they accept a topic's configs, and by each broker that opens it.

use std::collections::BTreeMap;
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
}

/// Topic configs this broker knows, with Kafka's defaults except `flush.messages`, which
/// defaults to 1 here: an acknowledged settlement record must survive a power cut.
pub const TOPIC_CONFIG_KEYS: &[(&str, &str)] = &[
    ("cleanup.policy", "delete"),
    ("delete.retention.ms", "86400000"),
    ("flush.messages", "1"),
    ("index.interval.bytes", "4096"),
    ("local.retention.bytes", "-2"),
    ("local.retention.ms", "-2"),
    ("max.message.bytes", "1048588"),
    ("min.acks", "0"),
    ("min.cleanable.dirty.ratio", "0.5"),
    ("min.compaction.lag.ms", "0"),
    ("min.insync.replicas", "1"),
    ("retention.bytes", "-1"),
    ("retention.ms", "604800000"),
    ("remote.storage.enable", "false"),
    ("segment.bytes", "1073741824"),
    ("segment.ms", "604800000"),
    ("unclean.leader.election.enable", "false"),
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

/// `cleanup.policy`: `delete`, `compact` or both (comma-separated, any order), normalized.
/// Compaction runs in the cold tier (strata-compactor), so a compacted topic wants
/// `remote.storage.enable=true`.
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
        // Compaction settings: the compactor (strata-compactor) reads them; checked here so
        // a bad value is refused when the topic is created, not found later.
        int(
            "delete.retention.ms",
            get("delete.retention.ms"),
            0,
            i64::MAX,
        )?;
        int(
            "min.compaction.lag.ms",
            get("min.compaction.lag.ms"),
            0,
            i64::MAX,
        )?;
        let ratio = get("min.cleanable.dirty.ratio");
        if !ratio
            .trim()
            .parse::<f64>()
            .is_ok_and(|r| (0.0..=1.0).contains(&r))
        {
            return Err(ConfigError::InvalidValue {
                key: "min.cleanable.dirty.ratio".into(),
                value: ratio.to_string(),
                reason: "must be a number between 0 and 1".into(),
            });
        }
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
        })
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
}
