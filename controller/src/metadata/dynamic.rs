//! Dynamic configs in the metadata: a layer of broker configs for the whole cluster and for
//! each broker that has its own, and a layer of group configs for each group that has any
//! (Kafka's IncrementalAlterConfigs / AlterConfigs on BROKER and GROUP resources). Which
//! names are dynamic and what values they take is strata-core's `dynamic_config`; every
//! layer is checked whole before it is stored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strata_core::dynamic_config::{self, DynamicConfigError, Scope};

use super::{BrokerId, MetadataError};

/// Where a dynamic config change applies (strata-core's [`Scope`], as the log stores it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfigScope {
    /// Kafka's broker resource named "": every broker without its own value.
    ClusterDefault,
    Broker(BrokerId),
    Group(String),
}

impl ConfigScope {
    pub fn core(&self) -> Scope {
        match self {
            ConfigScope::ClusterDefault => Scope::ClusterDefault,
            ConfigScope::Broker(id) => Scope::Broker(*id),
            ConfigScope::Group(g) => Scope::Group(g.clone()),
        }
    }
}

/// Longest group id that may have configs.
pub const MAX_GROUP_ID_BYTES: usize = 1024;
/// Most groups that may have configs at once.
pub const MAX_GROUPS_WITH_CONFIGS: usize = 100_000;

pub type Layer = BTreeMap<String, String>;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamicConfigs {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cluster: Layer,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub brokers: BTreeMap<BrokerId, Layer>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, Layer>,
}

fn refused(e: DynamicConfigError) -> MetadataError {
    match e {
        DynamicConfigError::NotDynamic(_) => MetadataError::InvalidRequest(e.to_string()),
        DynamicConfigError::Invalid(_) => MetadataError::InvalidConfig(e.to_string()),
    }
}

impl DynamicConfigs {
    pub fn is_empty(&self) -> bool {
        self.cluster.is_empty() && self.brokers.is_empty() && self.groups.is_empty()
    }

    /// The configs set at `scope` (none: an empty layer).
    pub fn layer(&self, scope: &ConfigScope) -> Option<&Layer> {
        match scope {
            ConfigScope::ClusterDefault => Some(&self.cluster),
            ConfigScope::Broker(id) => self.brokers.get(id),
            ConfigScope::Group(g) => self.groups.get(g),
        }
    }

    /// The checks a change needs before it is proposed: the scope's bounds, names that may
    /// change there and value sizes ([`DynamicConfigs::alter`] checks the layer it makes).
    pub fn check_change(scope: &ConfigScope, set: &Layer) -> Result<(), MetadataError> {
        if let ConfigScope::Group(g) = scope {
            if g.is_empty() || g.len() > MAX_GROUP_ID_BYTES {
                return Err(MetadataError::InvalidRequest(format!(
                    "a group id with configs has 1 to {MAX_GROUP_ID_BYTES} bytes"
                )));
            }
        }
        dynamic_config::check_names(&scope.core(), set).map_err(refused)
    }

    /// Removes then sets configs at `scope`; the layer it leaves must be valid whole.
    pub fn alter(
        &mut self,
        scope: &ConfigScope,
        set: &Layer,
        remove: &[String],
    ) -> Result<(), MetadataError> {
        let mut layer = self.layer(scope).cloned().unwrap_or_default();
        for k in remove {
            layer.remove(k);
        }
        layer.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
        dynamic_config::check_layer(&scope.core(), &layer).map_err(refused)?;
        match scope {
            ConfigScope::ClusterDefault => self.cluster = layer,
            ConfigScope::Broker(id) if layer.is_empty() => {
                self.brokers.remove(id);
            }
            ConfigScope::Broker(id) => {
                self.brokers.insert(*id, layer);
            }
            ConfigScope::Group(g) if layer.is_empty() => {
                self.groups.remove(g);
            }
            ConfigScope::Group(g) => {
                if !self.groups.contains_key(g) && self.groups.len() >= MAX_GROUPS_WITH_CONFIGS {
                    return Err(MetadataError::InvalidRequest(format!(
                        "{MAX_GROUPS_WITH_CONFIGS} groups have configs already; delete some \
                         (IncrementalAlterConfigs DELETE) first"
                    )));
                }
                self.groups.insert(g.clone(), layer);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(pairs: &[(&str, &str)]) -> Layer {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn layers_are_set_removed_and_dropped_when_empty() {
        let mut d = DynamicConfigs::default();
        let b = ConfigScope::Broker(2);
        d.alter(&b, &layer(&[("log.retention.ms", "1000")]), &[])
            .unwrap();
        d.alter(&b, &layer(&[("background.threads", "4")]), &[])
            .unwrap();
        assert_eq!(
            d.layer(&b),
            Some(&layer(&[
                ("background.threads", "4"),
                ("log.retention.ms", "1000")
            ]))
        );
        d.alter(
            &b,
            &Layer::new(),
            &["log.retention.ms".into(), "background.threads".into()],
        )
        .unwrap();
        assert!(d.is_empty());
    }

    #[test]
    fn a_refused_change_leaves_the_layer_as_it_was() {
        let mut d = DynamicConfigs::default();
        let c = ConfigScope::ClusterDefault;
        d.alter(&c, &layer(&[("log.retention.ms", "1000")]), &[])
            .unwrap();
        let before = d.clone();
        assert!(matches!(
            d.alter(&c, &layer(&[("broker.id", "3")]), &[]),
            Err(MetadataError::InvalidRequest(_))
        ));
        assert!(matches!(
            d.alter(&c, &layer(&[("log.retention.ms", "x")]), &[]),
            Err(MetadataError::InvalidConfig(_))
        ));
        assert_eq!(d, before);
    }

    #[test]
    fn group_layers_are_bounded() {
        let mut d = DynamicConfigs::default();
        let long = ConfigScope::Group("g".repeat(MAX_GROUP_ID_BYTES + 1));
        let set = layer(&[("consumer.session.timeout.ms", "50000")]);
        assert!(DynamicConfigs::check_change(&long, &set).is_err());
        d.alter(&ConfigScope::Group("g".into()), &set, &[]).unwrap();
        assert_eq!(d.groups.len(), 1);
    }
}
