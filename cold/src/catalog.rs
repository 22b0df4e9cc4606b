//! What the bucket says about its topics, so tools that read it without a cluster (the
//! replay CLI, the compactor) know names and configs: `{cluster}/{topic id}/topic.json`,
//! written by the brokers when they tier a topic and when its configs change.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};

use crate::manifest::{Manifest, ManifestStore, PartitionPrefix};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    pub name: String,
    /// The topic id (simple form), the directory its partitions live under.
    pub id: String,
    pub partitions: u32,
    /// The topic's configs (`cleanup.policy`, `retention.ms`, ...).
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
}

fn info_path(cluster: &str, topic_id: &str) -> Path {
    Path::from(format!("{cluster}/{topic_id}/topic.json"))
}

/// Writes (or replaces) a topic's description.
pub async fn write_topic(
    store: &Arc<dyn ObjectStore>,
    cluster: &str,
    info: &TopicInfo,
) -> Result<(), object_store::Error> {
    let body = serde_json::to_vec_pretty(info).expect("a topic description serializes");
    store
        .put(&info_path(cluster, &info.id), Bytes::from(body).into())
        .await
        .map(|_| ())
}

/// A topic found in the bucket.
#[derive(Debug, Clone)]
pub struct Topic {
    pub cluster: String,
    pub info: TopicInfo,
}

impl Topic {
    pub fn manifests(&self, store: &Arc<dyn ObjectStore>, partition: u32) -> ManifestStore {
        ManifestStore::new(
            store.clone(),
            PartitionPrefix::new(&self.cluster, &self.info.id, partition),
        )
    }

    /// Every partition's manifest, in partition order.
    pub async fn load_manifests(
        &self,
        store: &Arc<dyn ObjectStore>,
    ) -> Result<Vec<Manifest>, crate::manifest::ManifestError> {
        let mut out = Vec::with_capacity(self.info.partitions as usize);
        for p in 0..self.info.partitions {
            out.push(self.manifests(store, p).load().await?);
        }
        Ok(out)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("{key} is not a topic description: {why}")]
    Invalid { key: String, why: String },
}

/// Every topic the bucket describes, by cluster then name.
pub async fn topics(store: &Arc<dyn ObjectStore>) -> Result<Vec<Topic>, CatalogError> {
    let mut out = Vec::new();
    for cluster in store.list_with_delimiter(None).await?.common_prefixes {
        let cluster_name = cluster.filename().unwrap_or_default().to_string();
        for topic in store
            .list_with_delimiter(Some(&cluster))
            .await?
            .common_prefixes
        {
            let key = Path::from(format!("{topic}/topic.json"));
            let bytes = match store.get(&key).await {
                Ok(got) => got.bytes().await?,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let info: TopicInfo =
                serde_json::from_slice(&bytes).map_err(|e| CatalogError::Invalid {
                    key: key.to_string(),
                    why: e.to_string(),
                })?;
            out.push(Topic {
                cluster: cluster_name.clone(),
                info,
            });
        }
    }
    out.sort_by(|a, b| (&a.cluster, &a.info.name).cmp(&(&b.cluster, &b.info.name)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn topics_written_are_found_by_cluster_and_name() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        for (cluster, name, id) in [
            ("c1", "ledger", "a1"),
            ("c1", "audit", "b2"),
            ("c2", "x", "c3"),
        ] {
            write_topic(
                &store,
                cluster,
                &TopicInfo {
                    name: name.into(),
                    id: id.into(),
                    partitions: 2,
                    configs: BTreeMap::from([("cleanup.policy".into(), "compact".into())]),
                },
            )
            .await
            .unwrap();
        }
        // A partition directory without a description is not a topic.
        store
            .put(
                &Path::from("c2/zz/0/manifest/1.json"),
                Bytes::from_static(b"{}").into(),
            )
            .await
            .unwrap();
        let found = topics(&store).await.unwrap();
        let names: Vec<_> = found
            .iter()
            .map(|t| (t.cluster.as_str(), t.info.name.as_str()))
            .collect();
        assert_eq!(names, vec![("c1", "audit"), ("c1", "ledger"), ("c2", "x")]);
        assert_eq!(found[1].info.configs["cleanup.policy"], "compact");
    }
}
