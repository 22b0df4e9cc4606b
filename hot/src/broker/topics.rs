//! Topic specs and their durable store on a single node (`<data>/meta/topics.json`).
//!
//! The controller quorum replaces this store when Strata becomes a cluster; until then this
//! file is the one durable source of which topics exist and with which configs.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::log::write_atomically;

pub use strata_core::topic::validate_topic_name;

/// A topic as created: name, id, partition count, replication factor and config overrides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSpec {
    pub name: String,
    pub id: Uuid,
    pub partitions: u32,
    pub replication_factor: u16,
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StoreFile {
    cluster_id: String,
    /// Next producer id not yet handed out by any run of this broker.
    next_producer_id_block: i64,
    topics: Vec<TopicSpec>,
}

/// The durable topic list, cluster id and producer-id high-water mark.
pub struct TopicStore {
    dir: PathBuf,
    state: StoreFile,
}

const STORE_FILE: &str = "topics.json";

impl TopicStore {
    /// Loads the store, creating it (with a new cluster id) on first start.
    pub fn open(meta_dir: &Path) -> io::Result<TopicStore> {
        strata_core::private_fs::create_dir_all(meta_dir)?;
        let path = meta_dir.join(STORE_FILE);
        let state = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not a valid topic store: {e}", path.display()),
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => StoreFile {
                cluster_id: Uuid::new_v4().simple().to_string(),
                next_producer_id_block: 0,
                topics: Vec::new(),
            },
            Err(e) => return Err(e),
        };
        let store = TopicStore {
            dir: meta_dir.to_path_buf(),
            state,
        };
        store.persist()?;
        Ok(store)
    }

    fn persist(&self) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(&self.state).map_err(io::Error::other)?;
        write_atomically(&self.dir, STORE_FILE, &bytes)
    }

    pub fn cluster_id(&self) -> &str {
        &self.state.cluster_id
    }

    pub fn topics(&self) -> &[TopicSpec] {
        &self.state.topics
    }

    pub fn insert(&mut self, spec: TopicSpec) -> io::Result<()> {
        self.state.topics.retain(|t| t.name != spec.name);
        self.state.topics.push(spec);
        self.persist()
    }

    pub fn remove(&mut self, name: &str) -> io::Result<()> {
        self.state.topics.retain(|t| t.name != name);
        self.persist()
    }

    /// Reserves `count` producer ids durably and returns the first.
    pub fn reserve_producer_ids(&mut self, count: i64) -> io::Result<i64> {
        let first = self.state.next_producer_id_block;
        self.state.next_producer_id_block = first + count;
        self.persist()?;
        Ok(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_survives_reopen_and_ids_never_repeat() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = TopicStore::open(dir.path()).unwrap();
        let cluster = s.cluster_id().to_string();
        s.insert(TopicSpec {
            name: "t".into(),
            id: Uuid::new_v4(),
            partitions: 3,
            replication_factor: 1,
            configs: BTreeMap::new(),
        })
        .unwrap();
        let first = s.reserve_producer_ids(1000).unwrap();
        let mut s = TopicStore::open(dir.path()).unwrap();
        assert_eq!(s.cluster_id(), cluster);
        assert_eq!(s.topics().len(), 1);
        assert_eq!(s.reserve_producer_ids(1000).unwrap(), first + 1000);
        s.remove("t").unwrap();
        assert!(TopicStore::open(dir.path()).unwrap().topics().is_empty());
    }

    #[test]
    fn garbage_store_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(STORE_FILE), b"{nope").unwrap();
        let err = TopicStore::open(dir.path()).err().unwrap();
        assert!(err.to_string().contains("not a valid topic store"));
    }
}
