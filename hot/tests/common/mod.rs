//! What the in-process integration tests share.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use strata_hot::broker::BrokerConfig;

/// A single-node broker's config over `dir`, for tests to adjust with `..`.
pub fn broker_config(dir: &Path) -> BrokerConfig {
    BrokerConfig {
        data_dir: dir.to_path_buf(),
        node_id: 0,
        topic_defaults: BTreeMap::new(),
        default_partitions: 1,
        retention_check_interval: Duration::from_secs(3600),
        replica_lag_time_max: Duration::from_secs(30),
        replica_open_timeout: Duration::from_secs(30),
        groups: Default::default(),
        tier: None,
        auto_create_topics: false,
    }
}
