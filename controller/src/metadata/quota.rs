//! Client quotas with Kafka's model (KIP-13 byte rates, KIP-124 request time, KIP-546
//! entities): a quota names a user, a client id, or both, each by name or as the default,
//! and limits `producer_byte_rate`, `consumer_byte_rate` (bytes per second) or
//! `request_percentage` (percent of one request-handling thread). Stored in the metadata log;
//! every broker resolves the same quota for a connection with [`ClientQuotas::resolve`].
//! Pure logic: quotas in, the one that applies out. Enforcing them (rates, throttling) is
//! the broker's.
//!
//! Resolution follows Kafka's order, most specific first, for each quota key on its own:
//! `user + client`, `user + default client`, `user`, `default user + client`,
//! `default user + default client`, `default user`, `client`, `default client`. The entity
//! that matched decides who shares the quota: a quota of `user=alice` is shared by all of
//! alice's clients; one of the default user is had by every user on their own.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A user or client-id part of a quota entity: a name, or the default for every name
/// without a quota of its own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntityName {
    Default,
    Named(String),
}

impl std::fmt::Display for EntityName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntityName::Default => f.write_str("<default>"),
            EntityName::Named(n) => f.write_str(n),
        }
    }
}

/// Who a quota applies to: a user, a client id, or a user's client id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QuotaEntity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<EntityName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<EntityName>,
}

impl std::fmt::Display for QuotaEntity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.user, &self.client_id) {
            (Some(u), Some(c)) => write!(f, "user={u}, client-id={c}"),
            (Some(u), None) => write!(f, "user={u}"),
            (None, Some(c)) => write!(f, "client-id={c}"),
            (None, None) => f.write_str("(no entity)"),
        }
    }
}

/// What a quota limits, by Kafka's config names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum QuotaKey {
    #[serde(rename = "producer_byte_rate")]
    ProducerByteRate,
    #[serde(rename = "consumer_byte_rate")]
    ConsumerByteRate,
    #[serde(rename = "request_percentage")]
    RequestPercentage,
}

impl QuotaKey {
    pub const ALL: [QuotaKey; 3] = [
        QuotaKey::ProducerByteRate,
        QuotaKey::ConsumerByteRate,
        QuotaKey::RequestPercentage,
    ];

    pub fn name(self) -> &'static str {
        match self {
            QuotaKey::ProducerByteRate => "producer_byte_rate",
            QuotaKey::ConsumerByteRate => "consumer_byte_rate",
            QuotaKey::RequestPercentage => "request_percentage",
        }
    }

    pub fn from_name(name: &str) -> Result<QuotaKey, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                format!(
                "unknown quota '{name}'; Strata enforces producer_byte_rate, consumer_byte_rate \
                 and request_percentage"
            )
            })
    }
}

/// A quota's limit: finite and positive (so equality is total).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QuotaValue(f64);

impl Eq for QuotaValue {}

impl QuotaValue {
    pub fn new(v: f64) -> Result<QuotaValue, String> {
        if v.is_finite() && v > 0.0 {
            Ok(QuotaValue(v))
        } else {
            Err(format!("quota value {v} must be a positive number"))
        }
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// One entity's changes: keys set to a value, keys removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaAlteration {
    pub entity: QuotaEntity,
    #[serde(default)]
    pub set: BTreeMap<QuotaKey, QuotaValue>,
    #[serde(default)]
    pub remove: Vec<QuotaKey>,
}

/// The most entities with quotas one cluster keeps.
pub const MAX_QUOTA_ENTITIES: usize = 100_000;
/// The longest user or client-id name a quota may name (bytes).
pub const MAX_ENTITY_NAME: usize = 1024;

impl QuotaAlteration {
    /// Checks that need no state: an entity with a part, names of sane size.
    pub fn validate(&self) -> Result<(), String> {
        if self.entity.user.is_none() && self.entity.client_id.is_none() {
            return Err("a quota names a user, a client id, or both".into());
        }
        for part in [&self.entity.user, &self.entity.client_id]
            .into_iter()
            .flatten()
        {
            if let EntityName::Named(n) = part {
                if n.is_empty() || n.len() > MAX_ENTITY_NAME || n.chars().any(char::is_control) {
                    return Err(format!(
                        "entity name of {} bytes: it must be 1 to {MAX_ENTITY_NAME} bytes without control characters",
                        n.len()
                    ));
                }
            }
        }
        for v in self.set.values() {
            QuotaValue::new(v.0)?;
        }
        Ok(())
    }
}

/// Every quota in the cluster, by entity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClientQuotas(Vec<(QuotaEntity, BTreeMap<QuotaKey, QuotaValue>)>);

/// Who shares a resolved quota: the user and client id that the matched entity names
/// (`None` where it names neither, so all of them share it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuotaShare {
    pub user: Option<String>,
    pub client_id: Option<String>,
}

impl ClientQuotas {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &(QuotaEntity, BTreeMap<QuotaKey, QuotaValue>)> {
        self.0.iter()
    }

    pub fn get(&self, entity: &QuotaEntity) -> Option<&BTreeMap<QuotaKey, QuotaValue>> {
        self.0
            .binary_search_by(|(e, _)| e.cmp(entity))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Applies alterations, all or none.
    pub fn alter(&mut self, alterations: &[QuotaAlteration]) -> Result<(), String> {
        let mut next = self.0.clone();
        for a in alterations {
            a.validate()?;
            let at = match next.binary_search_by(|(e, _)| e.cmp(&a.entity)) {
                Ok(i) => i,
                Err(i) => {
                    next.insert(i, (a.entity.clone(), BTreeMap::new()));
                    i
                }
            };
            let values = &mut next[at].1;
            for k in &a.remove {
                values.remove(k);
            }
            values.extend(a.set.iter().map(|(k, v)| (*k, *v)));
            if values.is_empty() {
                next.remove(at);
            }
        }
        if next.len() > MAX_QUOTA_ENTITIES {
            return Err(format!(
                "{} entities would have quotas; at most {MAX_QUOTA_ENTITIES}",
                next.len()
            ));
        }
        self.0 = next;
        Ok(())
    }

    /// The quota of `key` for a connection of `user` with `client_id`, and who shares it;
    /// `None` when no quota applies.
    pub fn resolve(&self, user: &str, client_id: &str, key: QuotaKey) -> Option<(QuotaShare, f64)> {
        if self.0.is_empty() {
            return None;
        }
        // Kafka's order; `Some(Some(name))` is that name, `Some(None)` the default, `None` an
        // entity without that part. Compared in place: resolving allocates only the share.
        let (u, c) = (Some(Some(user)), Some(Some(client_id)));
        type Want<'a> = Option<Option<&'a str>>;
        let order: [(Want, Want); 8] = [
            (u, c),
            (u, Some(None)),
            (u, None),
            (Some(None), c),
            (Some(None), Some(None)),
            (Some(None), None),
            (None, c),
            (None, Some(None)),
        ];
        let is = |part: &Option<EntityName>, want: Want| match (part, want) {
            (None, None) => true,
            (Some(EntityName::Default), Some(None)) => true,
            (Some(EntityName::Named(n)), Some(Some(w))) => n == w,
            _ => false,
        };
        for (want_user, want_client) in order {
            let found = self.0.iter().find(|(e, values)| {
                is(&e.user, want_user) && is(&e.client_id, want_client) && values.contains_key(&key)
            });
            if let Some((e, values)) = found {
                let share = QuotaShare {
                    user: e.user.is_some().then(|| user.to_string()),
                    client_id: e.client_id.is_some().then(|| client_id.to_string()),
                };
                return Some((share, values[&key].get()));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(user: Option<&str>, client: Option<&str>) -> QuotaEntity {
        let name = |n: &str| {
            if n == "<default>" {
                EntityName::Default
            } else {
                EntityName::Named(n.into())
            }
        };
        QuotaEntity {
            user: user.map(name),
            client_id: client.map(name),
        }
    }

    fn set(q: &mut ClientQuotas, user: Option<&str>, client: Option<&str>, v: f64) {
        q.alter(&[QuotaAlteration {
            entity: entity(user, client),
            set: [(QuotaKey::ProducerByteRate, QuotaValue::new(v).unwrap())].into(),
            remove: vec![],
        }])
        .unwrap();
    }

    /// Kafka's precedence, most specific first: each level, once set, wins over every
    /// level after it, and the matched level decides who shares the quota.
    #[test]
    fn the_most_specific_entity_wins_in_kafkas_order() {
        let levels = [
            (None, Some("<default>")),
            (None, Some("app")),
            (Some("<default>"), None),
            (Some("<default>"), Some("<default>")),
            (Some("<default>"), Some("app")),
            (Some("alice"), None),
            (Some("alice"), Some("<default>")),
            (Some("alice"), Some("app")),
        ];
        let mut q = ClientQuotas::default();
        for (i, (u, c)) in levels.into_iter().enumerate() {
            set(&mut q, u, c, (i + 1) as f64);
            let (share, v) = q
                .resolve("alice", "app", QuotaKey::ProducerByteRate)
                .unwrap();
            assert_eq!(v, (i + 1) as f64, "after setting {u:?} {c:?}");
            assert_eq!(share.user.is_some(), u.is_some());
            assert_eq!(share.client_id.is_some(), c.is_some());
        }
        // another user only gets the default levels; other keys have no quota at all
        assert_eq!(
            q.resolve("bob", "app", QuotaKey::ProducerByteRate)
                .unwrap()
                .1,
            5.0
        );
        assert_eq!(
            q.resolve("bob", "other", QuotaKey::ProducerByteRate)
                .unwrap()
                .1,
            4.0
        );
        assert_eq!(q.resolve("alice", "app", QuotaKey::ConsumerByteRate), None);
    }

    #[test]
    fn removing_every_key_removes_the_entity_and_bad_alterations_change_nothing() {
        let mut q = ClientQuotas::default();
        set(&mut q, Some("alice"), None, 10.0);
        let before = q.clone();
        assert!(q
            .alter(&[QuotaAlteration {
                entity: entity(None, None),
                set: BTreeMap::new(),
                remove: vec![],
            }])
            .is_err());
        assert!(QuotaValue::new(f64::NAN).is_err() && QuotaValue::new(-1.0).is_err());
        assert!(q
            .alter(&[QuotaAlteration {
                entity: entity(Some("a\u{1b}b"), None),
                set: BTreeMap::new(),
                remove: vec![],
            }])
            .is_err());
        assert_eq!(q, before);
        q.alter(&[QuotaAlteration {
            entity: entity(Some("alice"), None),
            set: BTreeMap::new(),
            remove: vec![QuotaKey::ProducerByteRate],
        }])
        .unwrap();
        assert!(q.is_empty());
    }

    #[test]
    fn quotas_round_trip_through_json() {
        let mut q = ClientQuotas::default();
        set(&mut q, Some("<default>"), Some("app"), 1024.0);
        let json = serde_json::to_string(&q).unwrap();
        let back: ClientQuotas = serde_json::from_str(&json).unwrap();
        assert_eq!(back, q);
    }
}
