//! Admin calls to the controller quorum over gRPC (any controller answers; writes are
//! forwarded to the leader).

use std::collections::BTreeMap;

use strata_proto::v1::controller_client::ControllerClient;
use strata_proto::v1::{
    AlterClientQuotasRequest, AlterScramCredentialsRequest, CreateAclsRequest, CreateTopicRequest,
    DeleteAclsRequest, DeleteTopicRequest, DescribeQuorumRequest, DescribeQuorumResponse,
    DescribeScramCredentialsRequest, MetadataSnapshot, ScramCredentialInfo, ScramDeletion,
    ScramUpsertion, WatchRequest,
};

use crate::{ClientError, Result};

pub struct ControllerAdmin {
    client: ControllerClient<crate::GrpcChannel>,
}

impl ControllerAdmin {
    pub async fn connect(addr: &str) -> Result<ControllerAdmin> {
        let channel = crate::grpc_channel(addr).await?;
        Ok(ControllerAdmin {
            client: ControllerClient::new(channel),
        })
    }

    pub async fn describe_quorum(&mut self) -> Result<DescribeQuorumResponse> {
        Ok(self
            .client
            .describe_quorum(DescribeQuorumRequest {})
            .await
            .map_err(ClientError::from)?
            .into_inner())
    }

    /// Creates a topic; returns (topic id, created). `created` is false for an identical
    /// existing topic.
    pub async fn create_topic(
        &mut self,
        name: &str,
        partitions: u32,
        replication_factor: u32,
        configs: &BTreeMap<String, String>,
    ) -> Result<(String, bool)> {
        let resp = self
            .client
            .create_topic(CreateTopicRequest {
                name: name.to_string(),
                partitions,
                replication_factor,
                configs: configs.clone().into_iter().collect(),
                assignments: Vec::new(),
            })
            .await
            .map_err(ClientError::from)?
            .into_inner();
        Ok((resp.topic_id, resp.created))
    }

    /// Sets and deletes SCRAM credentials (keys derived by the caller); returns a metadata
    /// version that includes the changes.
    pub async fn alter_scram_credentials(
        &mut self,
        upsertions: Vec<ScramUpsertion>,
        deletions: Vec<ScramDeletion>,
    ) -> Result<u64> {
        Ok(self
            .client
            .alter_scram_credentials(AlterScramCredentialsRequest {
                upsertions,
                deletions,
            })
            .await
            .map_err(ClientError::from)?
            .into_inner()
            .version)
    }

    /// Adds ACL bindings (JSON, the metadata log's encoding); returns a metadata version
    /// that includes them.
    pub async fn create_acls_json(&mut self, acls_json: Vec<u8>) -> Result<u64> {
        Ok(self
            .client
            .create_acls(CreateAclsRequest { acls_json })
            .await
            .map_err(ClientError::from)?
            .into_inner()
            .version)
    }

    /// Sets and removes client quotas (JSON alterations, the metadata log's encoding), all
    /// or none; returns a metadata version that includes them.
    pub async fn alter_client_quotas_json(&mut self, alterations_json: Vec<u8>) -> Result<u64> {
        Ok(self
            .client
            .alter_client_quotas(AlterClientQuotasRequest { alterations_json })
            .await
            .map_err(ClientError::from)?
            .into_inner()
            .version)
    }

    /// Removes the ACL bindings any filter (JSON) matches; returns the removed ones (JSON).
    pub async fn delete_acls_json(&mut self, filters_json: Vec<u8>) -> Result<Vec<u8>> {
        Ok(self
            .client
            .delete_acls(DeleteAclsRequest { filters_json })
            .await
            .map_err(ClientError::from)?
            .into_inner()
            .deleted_json)
    }

    /// Users with SCRAM credentials: user, mechanism and iterations (never keys).
    pub async fn describe_scram_credentials(&mut self) -> Result<Vec<ScramCredentialInfo>> {
        Ok(self
            .client
            .describe_scram_credentials(DescribeScramCredentialsRequest {})
            .await
            .map_err(ClientError::from)?
            .into_inner()
            .credentials)
    }

    /// Kafka's ElectLeaders: preferred (each partition's first replica leads again, where
    /// it is alive and in the ISR) or unclean; `partitions` `None`: every partition.
    pub async fn elect_leaders(
        &mut self,
        unclean: bool,
        partitions: Option<Vec<(String, u32)>>,
    ) -> Result<Vec<strata_proto::v1::ElectLeaderResult>> {
        Ok(self
            .client
            .elect_leaders(strata_proto::v1::ElectLeadersRequest {
                unclean,
                all: partitions.is_none(),
                partitions: partitions
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(topic, partition)| strata_proto::v1::PartitionRef { topic, partition })
                    .collect(),
            })
            .await
            .map_err(ClientError::from)?
            .into_inner()
            .results)
    }

    /// Kafka's AlterPartitionReassignments: each move's result.
    pub async fn reassign_partitions(
        &mut self,
        moves: Vec<strata_proto::v1::PartitionMove>,
    ) -> Result<Vec<strata_proto::v1::ReassignPartitionResult>> {
        Ok(self
            .client
            .reassign_partitions(strata_proto::v1::ReassignPartitionsRequest { moves })
            .await
            .map_err(ClientError::from)?
            .into_inner()
            .results)
    }

    pub async fn delete_topic(&mut self, name: &str) -> Result<()> {
        self.client
            .delete_topic(DeleteTopicRequest {
                name: name.to_string(),
            })
            .await
            .map_err(ClientError::from)?;
        Ok(())
    }

    /// The controller's current metadata as JSON, with its version.
    pub async fn metadata_json(&mut self) -> Result<(u64, Vec<u8>)> {
        self.metadata_snapshot()
            .await
            .map(|s| (s.version, s.metadata_json))
    }

    /// The controller's current metadata snapshot: its version, its JSON, and whether the
    /// controller may be cut off from the quorum (then the snapshot may be behind).
    pub async fn metadata_snapshot(&mut self) -> Result<MetadataSnapshot> {
        use strata_proto::v1::metadata_update::Update;
        let mut stream = self
            .client
            .watch(WatchRequest { from_version: 0 })
            .await
            .map_err(ClientError::from)?
            .into_inner();
        match stream
            .message()
            .await
            .map_err(ClientError::from)?
            .and_then(|u| u.update)
        {
            Some(Update::Snapshot(snap)) => Ok(snap),
            Some(Update::Entry(_)) => Err(ClientError::Protocol(
                "the metadata stream did not start with a snapshot".into(),
            )),
            None => Err(ClientError::Protocol(
                "the metadata stream ended before its first snapshot".into(),
            )),
        }
    }
}
