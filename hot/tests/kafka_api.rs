//! The Kafka listener against raw and well-formed requests, in process: every served API at
//! every served version, the error codes Kafka clients rely on, and refusals of malformed
//! input (the connection is closed; the broker keeps serving).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, AlterClientQuotasRequest,
    AlterUserScramCredentialsRequest, ApiVersionsRequest, CreateAclsRequest,
    CreatePartitionsRequest, CreateTopicsRequest, DeleteAclsRequest, DeleteTopicsRequest,
    DescribeAclsRequest, DescribeClientQuotasRequest, DescribeConfigsRequest,
    DescribeTransactionsRequest, DescribeUserScramCredentialsRequest, EndTxnRequest, FetchRequest,
    IncrementalAlterConfigsRequest, InitProducerIdRequest, ListOffsetsRequest,
    ListTransactionsRequest, MetadataRequest, OffsetForLeaderEpochRequest, ProduceRequest,
    TopicName, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::StrBytes;
use strata_client::{fetch, list_offset, produce, Admin, ClientError, Connection};
use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_hot::broker::{Broker, BrokerConfig, SystemClock};
use strata_hot::kafka::SUPPORTED_APIS;
use tokio::sync::watch;

struct TestBroker {
    addr: String,
    _stop: watch::Sender<bool>,
    _broker: Arc<Broker>,
    _dir: tempfile::TempDir,
}

async fn start() -> TestBroker {
    let dir = tempfile::tempdir().unwrap();
    let mut defaults = BTreeMap::new();
    defaults.insert("max.message.bytes".to_string(), "10000".to_string());
    let broker = Broker::open(
        BrokerConfig {
            topic_defaults: defaults,
            default_partitions: 2,
            ..common::broker_config(dir.path())
        },
        Arc::new(SystemClock),
        None,
    )
    .await
    .unwrap();
    let (addr, stop) = common::serve_kafka(broker.clone()).await;
    TestBroker {
        addr,
        _stop: stop,
        _broker: broker,
        _dir: dir,
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn records(n: usize, ts: i64, ids: ProducerIds) -> Bytes {
    let values: Vec<Vec<u8>> = (0..n).map(|i| format!("value-{i}").into_bytes()).collect();
    let recs: Vec<Rec<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Rec {
            key: Some(b"key"),
            value: Some(v),
            timestamp_delta: i as i64,
        })
        .collect();
    Bytes::from(batch(ts, ids, &recs))
}

fn kafka_code(e: ClientError) -> i16 {
    match e {
        ClientError::Kafka { code, .. } => code,
        other => panic!("expected a Kafka error code, got {other}"),
    }
}

async fn with_topic(b: &TestBroker, name: &str, partitions: i32) {
    let mut admin = Admin::connect(&b.addr).await.unwrap();
    admin
        .create_topic(name, Some(partitions), None, &BTreeMap::new())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_served_api_answers_at_every_served_version() {
    let b = start().await;
    with_topic(&b, "sweep", 1).await;
    with_topic(&b, "grow", 1).await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    let topic = || TopicName(s("sweep"));
    for &(key, min, max) in SUPPORTED_APIS {
        for v in min..=max {
            use kafka_protocol::messages::ApiKey::*;
            let result = match key {
                ApiVersions => conn
                    .send(
                        &ApiVersionsRequest::default()
                            .with_client_software_name(s(if v >= 3 { "t" } else { "" }))
                            .with_client_software_version(s(if v >= 3 { "1" } else { "" })),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.error_code, 0)),
                Metadata => conn
                    .send(
                        &MetadataRequest::default().with_topics(Some(vec![
                            MetadataRequestTopic::default().with_name(Some(topic())),
                        ])),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.topics.len(), 1, "v{v}");
                        assert_eq!(r.topics[0].error_code, 0, "v{v}");
                    }),
                Produce => conn
                    .send(
                        &ProduceRequest::default()
                            .with_acks(-1)
                            .with_timeout_ms(5000)
                            .with_topic_data(vec![TopicProduceData::default()
                                .with_name(topic())
                                .with_partition_data(vec![PartitionProduceData::default()
                                    .with_index(0)
                                    .with_records(Some(records(2, 1000, ProducerIds::NONE)))])]),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.responses[0].partition_responses[0].error_code, 0, "v{v}")
                    }),
                Fetch => conn
                    .send(
                        &FetchRequest::default()
                            .with_max_wait_ms(10)
                            .with_max_bytes(1 << 20)
                            .with_topics(vec![FetchTopic::default()
                                .with_topic(topic())
                                .with_partitions(vec![FetchPartition::default()
                                    .with_partition(0)
                                    .with_partition_max_bytes(1 << 20)])]),
                        v,
                    )
                    .await
                    .map(|r| {
                        let p = &r.responses[0].partitions[0];
                        assert_eq!(p.error_code, 0, "v{v}");
                        assert!(!p.records.as_ref().unwrap().is_empty(), "v{v}");
                    }),
                ListOffsets => conn
                    .send(
                        &ListOffsetsRequest::default()
                            .with_replica_id((-1).into())
                            .with_topics(vec![ListOffsetsTopic::default()
                                .with_name(topic())
                                .with_partitions(vec![ListOffsetsPartition::default()
                                    .with_partition_index(0)
                                    .with_timestamp(-2)])]),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.topics[0].partitions[0].offset, 0, "v{v}")),
                CreateTopics => conn
                    .send(
                        &CreateTopicsRequest::default().with_topics(vec![CreatableTopic::default(
                        )
                        .with_name(TopicName(s(&format!("created-v{v}"))))
                        .with_num_partitions(1)
                        .with_replication_factor(1)]),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.topics[0].error_code, 0, "v{v}")),
                DeleteTopics => {
                    let name = TopicName(s(&format!("created-v{}", 2 + (v - 1) % 6)));
                    let req = if v >= 6 {
                        DeleteTopicsRequest::default()
                            .with_topics(vec![DeleteTopicState::default().with_name(Some(name))])
                    } else {
                        DeleteTopicsRequest::default().with_topic_names(vec![name])
                    };
                    conn.send(&req, v)
                        .await
                        .map(|r| assert_eq!(r.responses[0].error_code, 0, "v{v}"))
                }
                DescribeConfigs => conn
                    .send(
                        &DescribeConfigsRequest::default().with_resources(vec![
                            DescribeConfigsResource::default()
                                .with_resource_type(2)
                                .with_resource_name(s("sweep"))
                                .with_configuration_keys(None),
                        ]),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.results[0].error_code, 0, "v{v}");
                        assert!(r.results[0]
                            .configs
                            .iter()
                            .any(|c| c.name.as_str() == "retention.ms"));
                    }),
                InitProducerId => conn
                    .send(
                        &InitProducerIdRequest::default()
                            .with_transactional_id(None)
                            .with_transaction_timeout_ms(60_000),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.error_code, 0, "v{v}");
                        assert!(r.producer_id.0 >= 0);
                    }),
                // No __transaction_state yet: the coordinator is not here (NOT_COORDINATOR), and
                // a partition that does not exist is named before any coordinator is asked.
                AddPartitionsToTxn => conn
                    .send(
                        &AddPartitionsToTxnRequest::default()
                            .with_v3_and_below_transactional_id(s("sweeper").into())
                            .with_v3_and_below_producer_id(kafka_protocol::messages::ProducerId(1))
                            .with_v3_and_below_topics(vec![
                                kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                                    .with_name(TopicName(s("no-such-topic")))
                                    .with_partitions(vec![0]),
                            ]),
                        v,
                    )
                    .await
                    .map(|r| {
                        let p = &r.results_by_topic_v3_and_below[0].results_by_partition[0];
                        assert_eq!(p.partition_error_code, 3, "v{v}");
                    }),
                // No transaction coordinator for "sweeper" (or no offsets topic yet).
                AddOffsetsToTxn => conn
                    .send(
                        &AddOffsetsToTxnRequest::default()
                            .with_transactional_id(s("sweeper").into())
                            .with_producer_id(kafka_protocol::messages::ProducerId(1))
                            .with_group_id(s("sweep-group").into()),
                        v,
                    )
                    .await
                    .map(|r| assert!([15, 16].contains(&r.error_code), "v{v}: {}", r.error_code)),
                TxnOffsetCommit => conn
                    .send(
                        &TxnOffsetCommitRequest::default()
                            .with_transactional_id(s("sweeper").into())
                            .with_group_id(s("sweep-group").into())
                            .with_producer_id(kafka_protocol::messages::ProducerId(1))
                            .with_topics(vec![
                                kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                                    .with_name(TopicName(s("no-such-topic")))
                                    .with_partitions(vec![
                                        kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                                            .with_committed_offset(5),
                                    ]),
                            ]),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.topics[0].partitions[0].error_code, 3, "v{v}")),
                DescribeTransactions => conn
                    .send(
                        &DescribeTransactionsRequest::default()
                            .with_transactional_ids(vec![s("sweeper").into()]),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.transaction_states[0].error_code, 16, "v{v}")),
                ListTransactions => conn
                    .send(
                        &ListTransactionsRequest::default()
                            .with_state_filters(vec![s("Ongoing"), s("Sleeping")])
                            .with_duration_filter(-1),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.error_code, 0, "v{v}");
                        assert!(r.transaction_states.is_empty());
                        assert_eq!(r.unknown_state_filters, vec![s("Sleeping")], "v{v}");
                    }),
                EndTxn => conn
                    .send(
                        &EndTxnRequest::default()
                            .with_transactional_id(s("sweeper").into())
                            .with_producer_id(kafka_protocol::messages::ProducerId(1)),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.error_code, 16, "v{v}")),
                CreatePartitions => conn
                    .send(
                        &CreatePartitionsRequest::default().with_topics(vec![
                            CreatePartitionsTopic::default()
                                .with_name(TopicName(s("grow")))
                                .with_count(i32::from(v) + 2)
                                .with_assignments(None),
                        ]),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(
                            r.results[0].error_code, 0,
                            "v{v}: {:?}",
                            r.results[0].error_message
                        )
                    }),
                AlterConfigs => {
                    use kafka_protocol::messages::alter_configs_request as legacy;
                    conn.send(
                        &kafka_protocol::messages::AlterConfigsRequest::default().with_resources(
                            vec![legacy::AlterConfigsResource::default()
                                .with_resource_type(2)
                                .with_resource_name(s("sweep"))
                                .with_configs(vec![legacy::AlterableConfig::default()
                                    .with_name(s("segment.ms"))
                                    .with_value(Some(s(&format!(
                                        "{}",
                                        100_000 + i64::from(v)
                                    ))))])],
                        ),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(
                            r.responses[0].error_code, 0,
                            "v{v}: {:?}",
                            r.responses[0].error_message
                        )
                    })
                }
                IncrementalAlterConfigs => conn
                    .send(
                        &IncrementalAlterConfigsRequest::default().with_resources(vec![
                            AlterConfigsResource::default()
                                .with_resource_type(2)
                                .with_resource_name(s("sweep"))
                                .with_configs(vec![AlterableConfig::default()
                                    .with_name(s("retention.ms"))
                                    .with_config_operation(0)
                                    .with_value(Some(s(&format!("{}", 100_000 + i64::from(v)))))]),
                        ]),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(
                            r.responses[0].error_code, 0,
                            "v{v}: {:?}",
                            r.responses[0].error_message
                        )
                    }),
                OffsetForLeaderEpoch => conn
                    .send(
                        &OffsetForLeaderEpochRequest::default()
                            .with_replica_id((-1).into())
                            .with_topics(vec![OffsetForLeaderTopic::default()
                                .with_topic(topic())
                                .with_partitions(vec![OffsetForLeaderPartition::default()
                                    .with_partition(0)
                                    .with_current_leader_epoch(0)
                                    .with_leader_epoch(0)])]),
                        v,
                    )
                    .await
                    .map(|r| {
                        let p = &r.topics[0].partitions[0];
                        assert_eq!((p.error_code, p.leader_epoch), (0, 0), "v{v}");
                        assert!(p.end_offset > 0, "v{v}");
                    }),
                // Covered version by version in tests/group_api.rs.
                FindCoordinator | JoinGroup | SyncGroup | Heartbeat | LeaveGroup | OffsetCommit
                | OffsetFetch | ListGroups | DescribeGroups | DeleteGroups | OffsetDelete
                | ConsumerGroupHeartbeat | ConsumerGroupDescribe => continue,
                // SASL changes the connection's state: tests/test_security.py drives both
                // versions of the handshake with real clients.
                SaslHandshake | SaslAuthenticate => continue,
                // A single node without controllers keeps no ACLs: described as none,
                // changes refused with INVALID_REQUEST (42). tests/test_acls.py covers them
                // with controllers.
                DescribeAcls => conn
                    .send(
                        &DescribeAclsRequest::default()
                            .with_resource_type_filter(1)
                            .with_pattern_type_filter(1)
                            .with_operation(1)
                            .with_permission_type(1),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.error_code, 0, "v{v}: {:?}", r.error_message);
                        assert!(r.resources.is_empty());
                    }),
                CreateAcls => conn
                    .send(
                        &CreateAclsRequest::default().with_creations(vec![AclCreation::default()
                            .with_resource_type(2)
                            .with_resource_name(s("t"))
                            .with_resource_pattern_type(3)
                            .with_principal(s("User:a"))
                            .with_host(s("*"))
                            .with_operation(3)
                            .with_permission_type(3)]),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.results[0].error_code, 42, "v{v}")),
                DeleteAcls => conn
                    .send(
                        &DeleteAclsRequest::default().with_filters(vec![
                            DeleteAclsFilter::default()
                                .with_resource_type_filter(1)
                                .with_pattern_type_filter(1)
                                .with_operation(1)
                                .with_permission_type(1),
                        ]),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.filter_results[0].error_code, 42, "v{v}")),
                // Users, like ACLs, need the controllers (tests/test_security.py).
                DescribeUserScramCredentials => conn
                    .send(&DescribeUserScramCredentialsRequest::default(), v)
                    .await
                    .map(|r| {
                        assert_eq!(r.error_code, 0, "v{v}: {:?}", r.error_message);
                        assert!(r.results.is_empty());
                    }),
                AlterUserScramCredentials => conn
                    .send(
                        &AlterUserScramCredentialsRequest::default().with_upsertions(vec![
                            ScramCredentialUpsertion::default()
                                .with_name(s("carol"))
                                .with_mechanism(2)
                                .with_iterations(8192)
                                .with_salt(bytes::Bytes::from_static(b"salt"))
                                .with_salted_password(bytes::Bytes::from_static(&[7; 64])),
                        ]),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.results[0].error_code, 42, "v{v}")),
                // Quotas, like ACLs, need the controllers (tests/test_limits.py).
                DescribeClientQuotas => conn
                    .send(
                        &DescribeClientQuotasRequest::default().with_components(vec![
                            kafka_protocol::messages::describe_client_quotas_request::ComponentData::default()
                                .with_entity_type(s("client-id"))
                                .with_match_type(2)
                                .with_match(None),
                        ]),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.error_code, 0, "v{v}: {:?}", r.error_message);
                        assert_eq!(r.entries.map(|e| e.len()), Some(0));
                    }),
                AlterClientQuotas => conn
                    .send(
                        &AlterClientQuotasRequest::default().with_entries(vec![
                            kafka_protocol::messages::alter_client_quotas_request::EntryData::default()
                                .with_entity(vec![
                                    kafka_protocol::messages::alter_client_quotas_request::EntityData::default()
                                        .with_entity_type(s("user"))
                                        .with_entity_name(Some(s("carol"))),
                                ])
                                .with_ops(vec![
                                    kafka_protocol::messages::alter_client_quotas_request::OpData::default()
                                        .with_key(s("producer_byte_rate"))
                                        .with_value(1024.0),
                                ]),
                        ]),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!(r.entries[0].error_code, 42, "v{v}")),
                DescribeCluster => conn
                    .send(
                        &kafka_protocol::messages::DescribeClusterRequest::default()
                            .with_include_cluster_authorized_operations(true)
                            .with_endpoint_type(1),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.error_code, 0, "v{v}");
                        assert!(!r.cluster_id.is_empty(), "v{v}");
                        assert_eq!(r.brokers.len(), 1, "v{v}");
                        // an open cluster: every cluster operation (KIP-430's bits: Create 5,
                        // Alter 7, Describe 8, ClusterAction 9, DescribeConfigs 10,
                        // AlterConfigs 11, IdempotentWrite 12)
                        let every = [5, 7, 8, 9, 10, 11, 12].iter().fold(0, |b, op| b | 1 << op);
                        assert_eq!(r.cluster_authorized_operations, every, "v{v}");
                    }),
                // Deleting nothing (offset 0) on a standalone broker: answered at once with
                // the low watermark. tests/test_delete_records.py deletes for real.
                DeleteRecords => conn
                    .send(
                        &kafka_protocol::messages::DeleteRecordsRequest::default()
                            .with_timeout_ms(5_000)
                            .with_topics(vec![
                                kafka_protocol::messages::delete_records_request::DeleteRecordsTopic::default()
                                    .with_name(topic())
                                    .with_partitions(vec![
                                        kafka_protocol::messages::delete_records_request::DeleteRecordsPartition::default()
                                            .with_partition_index(0)
                                            .with_offset(0),
                                    ]),
                            ]),
                        v,
                    )
                    .await
                    .map(|r| {
                        let p = &r.topics[0].partitions[0];
                        assert_eq!((p.error_code, p.low_watermark), (0, 0), "v{v}");
                    }),
                DescribeLogDirs => conn
                    .send(
                        &kafka_protocol::messages::DescribeLogDirsRequest::default().with_topics(Some(vec![
                            kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic::default()
                                .with_topic(topic())
                                .with_partitions(vec![0]),
                        ])),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!((r.error_code, r.results.len()), (0, 1), "v{v}");
                        let dir = &r.results[0];
                        assert!(dir.log_dir.ends_with("logs"), "v{v}: {:?}", dir.log_dir);
                        assert_eq!(dir.topics.len(), 1, "v{v}");
                        assert_eq!(dir.topics[0].partitions[0].partition_index, 0, "v{v}");
                        assert!(dir.topics[0].partitions[0].partition_size > 0, "v{v}");
                        if v >= 4 {
                            assert!(dir.total_bytes > 0 && dir.usable_bytes > 0, "v{v}");
                        }
                    }),
                // A standalone broker's partitions are led by their only replica.
                // tests/test_elect_leaders.py elects for real on a 3 + 3 cluster.
                ElectLeaders => conn
                    .send(
                        &kafka_protocol::messages::ElectLeadersRequest::default()
                            .with_election_type(0)
                            .with_timeout_ms(5_000)
                            .with_topic_partitions(Some(vec![
                                kafka_protocol::messages::elect_leaders_request::TopicPartitions::default()
                                    .with_topic(topic())
                                    .with_partitions(vec![0, 7]),
                            ])),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.error_code, 0, "v{v}");
                        let codes: Vec<i16> = r.replica_election_results[0]
                            .partition_result
                            .iter()
                            .map(|p| p.error_code)
                            .collect();
                        // ELECTION_NOT_NEEDED (84), UNKNOWN_TOPIC_OR_PARTITION (3)
                        assert_eq!(codes, vec![84, 3], "v{v}");
                    }),
                        // A single broker (id 0 here) has nowhere to move a partition: to itself is
                // nothing to do. tests/test_reassignment.py moves partitions on a 3 + 3
                // cluster.
                AlterPartitionReassignments => conn
                    .send(
                        &kafka_protocol::messages::AlterPartitionReassignmentsRequest::default()
                            .with_timeout_ms(5_000)
                            .with_allow_replication_factor_change(true)
                            .with_topics(vec![
                                kafka_protocol::messages::alter_partition_reassignments_request::ReassignableTopic::default()
                                    .with_name(topic())
                                    .with_partitions(vec![
                                        kafka_protocol::messages::alter_partition_reassignments_request::ReassignablePartition::default()
                                            .with_partition_index(0)
                                            .with_replicas(Some(vec![0.into()])),
                                        kafka_protocol::messages::alter_partition_reassignments_request::ReassignablePartition::default()
                                            .with_partition_index(7)
                                            .with_replicas(Some(vec![2.into()])),
                                    ]),
                            ]),
                        v,
                    )
                    .await
                    .map(|r| {
                        assert_eq!(r.error_code, 0, "v{v}");
                        let codes: Vec<i16> =
                            r.responses[0].partitions.iter().map(|p| p.error_code).collect();
                        // (UNKNOWN_TOPIC_OR_PARTITION: the sweep topic has one partition)
                        assert_eq!(codes, vec![0, 3], "v{v}");
                    }),
                ListPartitionReassignments => conn
                    .send(
                        &kafka_protocol::messages::ListPartitionReassignmentsRequest::default()
                            .with_timeout_ms(5_000),
                        v,
                    )
                    .await
                    .map(|r| assert_eq!((r.error_code, r.topics.len()), (0, 0), "v{v}")),
                // tests/test_kafka_python.py checks the producers an idempotent client left.
                DescribeProducers => conn
                    .send(
                        &kafka_protocol::messages::DescribeProducersRequest::default().with_topics(vec![
                            kafka_protocol::messages::describe_producers_request::TopicRequest::default()
                                .with_name(topic())
                                .with_partition_indexes(vec![0, 7]),
                        ]),
                        v,
                    )
                    .await
                    .map(|r| {
                        let codes: Vec<i16> =
                            r.topics[0].partitions.iter().map(|p| p.error_code).collect();
                        assert_eq!(codes, vec![0, 3], "v{v}");
                    }),
                other => panic!("no sweep case for {other:?}"),
            };
            result.unwrap_or_else(|e| panic!("{key:?} v{v}: {e}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_api_versions_request_gets_v0_answer_with_error_35() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = start().await;
    let mut raw = tokio::net::TcpStream::connect(&b.addr).await.unwrap();
    // ApiVersions v99, correlation id 7, null client id: Kafka answers in the v0 format.
    raw.write_all(&[0, 0, 0, 10, 0, 18, 0, 99, 0, 0, 0, 7, 0xff, 0xff])
        .await
        .unwrap();
    let len = raw.read_u32().await.unwrap() as usize;
    let mut body = vec![0u8; len];
    raw.read_exact(&mut body).await.unwrap();
    assert_eq!(&body[..4], &7i32.to_be_bytes(), "correlation id");
    assert_eq!(&body[4..6], &35i16.to_be_bytes(), "UNSUPPORTED_VERSION");
    let api_count = u32::from_be_bytes(body[6..10].try_into().unwrap()) as usize;
    assert_eq!(api_count, SUPPORTED_APIS.len());
}

async fn assert_closed(b: &TestBroker, bytes: &[u8]) {
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    conn.write_raw(bytes).await.unwrap();
    let got = conn.read_to_close(Duration::from_secs(5)).await.unwrap();
    assert!(
        got.is_empty(),
        "expected a closed connection, got {} bytes",
        got.len()
    );
    // The broker still serves others.
    let mut admin = Admin::connect(&b.addr).await.unwrap();
    admin.list_topics(&[]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_the_connection_and_nothing_else() {
    let b = start().await;
    // unknown api key 999
    assert_closed(&b, &[0, 0, 0, 8, 0x03, 0xe7, 0, 0, 0, 0, 0, 1]).await;
    // known api (Metadata), unsupported version 99
    assert_closed(&b, &[0, 0, 0, 8, 0, 3, 0, 99, 0, 0, 0, 1]).await;
    // frame larger than max_request_bytes
    assert_closed(&b, &[0x7f, 0xff, 0xff, 0xff]).await;
    // negative and tiny sizes
    assert_closed(&b, &[0xff, 0xff, 0xff, 0xff]).await;
    assert_closed(&b, &[0, 0, 0, 2, 0, 0]).await;
    // a header that claims a 30000-byte client id
    assert_closed(&b, &[0, 0, 0, 10, 0, 3, 0, 1, 0, 0, 0, 1, 0x75, 0x30]).await;
    // truncated frame: the length promises more than ever arrives (frame timeout 300 ms)
    let started = Instant::now();
    assert_closed(&b, &[0, 0, 0, 100, 0, 3, 0, 1]).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    // an array claiming 704 million topics in a 14-byte Metadata request (found by fuzzing:
    // it used to abort the process on a 50 GB allocation)
    assert_closed(
        &b,
        &[
            0, 0, 0, 14, 0, 3, 0, 0, 0xe1, 0, 0, 0x45, 0, 0, 0x2a, 0, 0xff, 0xff,
        ],
    )
    .await;
    // garbage body for a known api
    assert_closed(&b, &[0, 0, 0, 12, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0x80, 0x80]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_errors_carry_kafkas_codes() {
    let b = start().await;
    with_topic(&b, "t", 1).await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    let good = records(3, 1000, ProducerIds::NONE);
    assert_eq!(
        produce(&mut conn, "t", 0, good.clone(), -1).await.unwrap(),
        0
    );
    assert_eq!(
        produce(&mut conn, "t", 0, good.clone(), 1).await.unwrap(),
        3
    );
    // unknown topic and partition
    assert_eq!(
        kafka_code(
            produce(&mut conn, "nope", 0, good.clone(), -1)
                .await
                .unwrap_err()
        ),
        3
    );
    assert_eq!(
        kafka_code(
            produce(&mut conn, "t", 7, good.clone(), -1)
                .await
                .unwrap_err()
        ),
        3
    );
    // CRC mismatch
    let mut bad = good.to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert_eq!(
        kafka_code(
            produce(&mut conn, "t", 0, Bytes::from(bad), -1)
                .await
                .unwrap_err()
        ),
        2
    );
    // truncated batch
    assert_eq!(
        kafka_code(
            produce(&mut conn, "t", 0, good.slice(..40), -1)
                .await
                .unwrap_err()
        ),
        2
    );
    // old message format
    let mut v1 = good.to_vec();
    v1[16] = 1;
    assert_eq!(
        kafka_code(
            produce(&mut conn, "t", 0, Bytes::from(v1), -1)
                .await
                .unwrap_err()
        ),
        43
    );
    // two batches in one partition's records
    let mut two = good.to_vec();
    two.extend_from_slice(&good);
    assert_eq!(
        kafka_code(
            produce(&mut conn, "t", 0, Bytes::from(two), -1)
                .await
                .unwrap_err()
        ),
        87
    );
    // over max.message.bytes (10000 in this broker's defaults)
    let big = Bytes::from(batch(
        0,
        ProducerIds::NONE,
        &[Rec {
            key: None,
            value: Some(&[7u8; 20_000]),
            timestamp_delta: 0,
        }],
    ));
    assert_eq!(
        kafka_code(produce(&mut conn, "t", 0, big, -1).await.unwrap_err()),
        10
    );
    // invalid acks
    assert_eq!(
        kafka_code(
            produce(&mut conn, "t", 0, good.clone(), 2)
                .await
                .unwrap_err()
        ),
        21
    );
    // acks=0 gets no response; the next request on the connection is answered in order
    assert_eq!(
        produce(&mut conn, "t", 0, good.clone(), 0).await.unwrap(),
        -1
    );
    assert_eq!(
        produce(&mut conn, "t", 0, good.clone(), -1).await.unwrap(),
        9
    );
    // nothing refused was written
    assert_eq!(list_offset(&mut conn, "t", 0, -1).await.unwrap(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_retries_get_the_original_offset_and_gaps_are_refused() {
    let b = start().await;
    with_topic(&b, "idem", 1).await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    let init = conn
        .send(
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60_000),
            4,
        )
        .await
        .unwrap();
    let ids = |seq| ProducerIds {
        producer_id: init.producer_id.0,
        producer_epoch: init.producer_epoch,
        base_sequence: seq,
    };
    assert_eq!(
        produce(&mut conn, "idem", 0, records(5, 0, ids(0)), -1)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        produce(&mut conn, "idem", 0, records(5, 0, ids(5)), -1)
            .await
            .unwrap(),
        5
    );
    // a retry of the first batch: its original offset, nothing appended
    assert_eq!(
        produce(&mut conn, "idem", 0, records(5, 0, ids(0)), -1)
            .await
            .unwrap(),
        0
    );
    assert_eq!(list_offset(&mut conn, "idem", 0, -1).await.unwrap(), 10);
    // a gap
    assert_eq!(
        kafka_code(
            produce(&mut conn, "idem", 0, records(1, 0, ids(11)), -1)
                .await
                .unwrap_err()
        ),
        45
    );
    // a second producer gets a different id
    let other = conn
        .send(
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60_000),
            4,
        )
        .await
        .unwrap();
    assert_ne!(other.producer_id, init.producer_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_admin_is_idempotent_and_refuses_bad_specs() {
    let b = start().await;
    let mut admin = Admin::connect(&b.addr).await.unwrap();
    let none = BTreeMap::new();
    admin
        .create_topic("orders", Some(3), Some(1), &none)
        .await
        .unwrap();
    // same spec again: a no-op success
    admin
        .create_topic("orders", Some(3), None, &none)
        .await
        .unwrap();
    // different spec: refused with a message naming both
    match admin
        .create_topic("orders", Some(4), None, &none)
        .await
        .unwrap_err()
    {
        ClientError::Kafka { code: 36, message } => {
            assert!(message.contains("3 partitions"), "{message}")
        }
        other => panic!("{other}"),
    }
    let code = |r: Result<(), ClientError>| kafka_code(r.unwrap_err());
    assert_eq!(
        code(admin.create_topic("bad/name", Some(1), None, &none).await),
        17
    );
    assert_eq!(code(admin.create_topic("", Some(1), None, &none).await), 17);
    assert_eq!(
        code(admin.create_topic("zero", Some(0), None, &none).await),
        37
    );
    assert_eq!(
        code(admin.create_topic("rf3", Some(1), Some(3), &none).await),
        38
    );
    let mut bad_config = BTreeMap::new();
    bad_config.insert("retention.ms".to_string(), "soon".to_string());
    assert_eq!(
        code(admin.create_topic("cfg", Some(1), None, &bad_config).await),
        40
    );
    let mut unknown_config = BTreeMap::new();
    unknown_config.insert("no.such.config".to_string(), "1".to_string());
    assert_eq!(
        code(
            admin
                .create_topic("cfg", Some(1), None, &unknown_config)
                .await
        ),
        40
    );
    // defaults: partitions from the broker (2 here)
    admin
        .create_topic("defaults", None, None, &none)
        .await
        .unwrap();
    let topics = admin.list_topics(&[]).await.unwrap();
    let names: Vec<_> = topics
        .iter()
        .map(|t| (t.name.as_str(), t.partitions))
        .collect();
    assert_eq!(names, vec![("defaults", 2), ("orders", 3)]);
    // configs: overrides show as the topic's, others as broker or default
    let mut cfg = BTreeMap::new();
    cfg.insert("retention.ms".to_string(), "1000".to_string());
    admin
        .create_topic("short", Some(1), None, &cfg)
        .await
        .unwrap();
    let described = admin.describe_configs("short").await.unwrap();
    let get = |k: &str| described.iter().find(|c| c.name == k).unwrap().clone();
    assert_eq!(
        (
            get("retention.ms").value.as_str(),
            get("retention.ms").source
        ),
        ("1000", "topic")
    );
    assert_eq!(get("max.message.bytes").source, "broker");
    assert_eq!(get("segment.bytes").source, "default");
    assert_eq!(
        kafka_code(admin.describe_configs("nope").await.unwrap_err()),
        3
    );
    // delete
    admin.delete_topic("orders").await.unwrap();
    assert_eq!(
        kafka_code(admin.list_topics(&["orders"]).await.unwrap_err()),
        3
    );
    assert_eq!(
        kafka_code(admin.delete_topic("orders").await.unwrap_err()),
        3
    );
    // re-create after delete starts empty
    admin
        .create_topic("orders", Some(1), None, &none)
        .await
        .unwrap();
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    assert_eq!(list_offset(&mut conn, "orders", 0, -1).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_long_polls_until_data_arrives_and_list_offsets_finds_timestamps() {
    let b = start().await;
    with_topic(&b, "lp", 1).await;
    let addr = b.addr.clone();
    let waiter = tokio::spawn(async move {
        let mut conn = Connection::connect(&addr).await.unwrap();
        let started = Instant::now();
        let got = fetch(&mut conn, "lp", 0, 0, 1 << 20, Duration::from_secs(20))
            .await
            .unwrap();
        (got, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    produce(
        &mut conn,
        "lp",
        0,
        records(4, 10_000, ProducerIds::NONE),
        -1,
    )
    .await
    .unwrap();
    let (got, waited) = waiter.await.unwrap();
    assert!(!got.records.is_empty());
    assert_eq!(got.high_watermark, 4);
    assert!(
        waited < Duration::from_secs(20),
        "the long poll ended by data, not by timeout"
    );
    produce(
        &mut conn,
        "lp",
        0,
        records(4, 20_000, ProducerIds::NONE),
        -1,
    )
    .await
    .unwrap();
    assert_eq!(list_offset(&mut conn, "lp", 0, -2).await.unwrap(), 0);
    assert_eq!(list_offset(&mut conn, "lp", 0, -1).await.unwrap(), 8);
    assert_eq!(list_offset(&mut conn, "lp", 0, 10_002).await.unwrap(), 2);
    assert_eq!(list_offset(&mut conn, "lp", 0, 15_000).await.unwrap(), 4);
    assert_eq!(list_offset(&mut conn, "lp", 0, 99_000).await.unwrap(), -1);
    // a fetch past the end is OFFSET_OUT_OF_RANGE; at the end it waits and returns empty
    assert_eq!(
        kafka_code(
            fetch(&mut conn, "lp", 0, 9, 1 << 20, Duration::from_millis(10))
                .await
                .unwrap_err()
        ),
        1
    );
    let empty = fetch(&mut conn, "lp", 0, 8, 1 << 20, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(empty.records.is_empty());
    assert_eq!(
        kafka_code(
            fetch(&mut conn, "nope", 0, 0, 1 << 20, Duration::from_millis(10))
                .await
                .unwrap_err()
        ),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_can_be_altered_and_partitions_added() {
    let b = start().await;
    with_topic(&b, "t", 2).await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    let alter = |op: i8, key: &str, value: Option<&str>| {
        IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s("t"))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(s(key))
                    .with_config_operation(op)
                    .with_value(value.map(s))]),
        ])
    };
    let code =
        |r: kafka_protocol::messages::IncrementalAlterConfigsResponse| r.responses[0].error_code;
    assert_eq!(
        code(
            conn.send(&alter(0, "retention.ms", Some("5000")), 1)
                .await
                .unwrap()
        ),
        0
    );
    let mut admin = Admin::connect(&b.addr).await.unwrap();
    let get = |cfg: &[strata_client::ConfigEntry], k: &str| {
        cfg.iter().find(|c| c.name == k).unwrap().clone()
    };
    let described = admin.describe_configs("t").await.unwrap();
    assert_eq!(
        (
            get(&described, "retention.ms").value.as_str(),
            get(&described, "retention.ms").source
        ),
        ("5000", "topic")
    );
    // DELETE returns the key to its default; bad values and unknown keys are INVALID_CONFIG
    assert_eq!(
        code(conn.send(&alter(1, "retention.ms", None), 1).await.unwrap()),
        0
    );
    assert_eq!(
        get(&admin.describe_configs("t").await.unwrap(), "retention.ms").source,
        "default"
    );
    assert_eq!(
        code(
            conn.send(&alter(0, "retention.ms", Some("soon")), 1)
                .await
                .unwrap()
        ),
        40
    );
    assert_eq!(
        code(conn.send(&alter(0, "no.such", Some("1")), 1).await.unwrap()),
        40
    );
    // APPEND and SUBTRACT work on list configs only (Kafka's rule)
    assert_eq!(
        code(
            conn.send(&alter(2, "cleanup.policy", Some("compact")), 1)
                .await
                .unwrap()
        ),
        0
    );
    assert_eq!(
        get(
            &admin.describe_configs("t").await.unwrap(),
            "cleanup.policy"
        )
        .value,
        "delete,compact"
    );
    assert_eq!(
        code(
            conn.send(&alter(3, "cleanup.policy", Some("compact")), 1)
                .await
                .unwrap()
        ),
        0
    );
    assert_eq!(
        code(
            conn.send(&alter(2, "retention.ms", Some("5")), 1)
                .await
                .unwrap()
        ),
        40
    );
    // the topic survives a restart of the store with its configs: checked through describe
    let grow = |count: i32| {
        CreatePartitionsRequest::default().with_topics(vec![CreatePartitionsTopic::default()
            .with_name(TopicName(s("t")))
            .with_count(count)
            .with_assignments(None)])
    };
    assert_eq!(
        conn.send(&grow(5), 3).await.unwrap().results[0].error_code,
        0
    );
    assert_eq!(admin.list_topics(&["t"]).await.unwrap()[0].partitions, 5);
    assert_eq!(
        conn.send(&grow(3), 3).await.unwrap().results[0].error_code,
        37
    );
    // the new partitions take writes; the old ones kept their data
    produce(&mut conn, "t", 0, records(2, 0, ProducerIds::NONE), -1)
        .await
        .unwrap();
    assert_eq!(
        produce(&mut conn, "t", 4, records(2, 0, ProducerIds::NONE), -1)
            .await
            .unwrap(),
        0
    );
    assert_eq!(list_offset(&mut conn, "t", 0, -1).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_epoch_the_broker_does_not_know_is_refused() {
    let b = start().await;
    with_topic(&b, "e", 1).await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    produce(&mut conn, "e", 0, records(1, 0, ProducerIds::NONE), -1)
        .await
        .unwrap();
    let fetch_at = |epoch: i32| {
        FetchRequest::default()
            .with_max_wait_ms(10)
            .with_max_bytes(1 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(s("e")))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(epoch)
                    .with_partition_max_bytes(1 << 20)])])
    };
    let code = |r: kafka_protocol::messages::FetchResponse| r.responses[0].partitions[0].error_code;
    // this single node leads at epoch 0: 0 and "not given" (-1) are served, a newer one is not
    assert_eq!(code(conn.send(&fetch_at(0), 12).await.unwrap()), 0);
    assert_eq!(code(conn.send(&fetch_at(-1), 12).await.unwrap()), 0);
    assert_eq!(
        code(conn.send(&fetch_at(3), 12).await.unwrap()),
        75,
        "UNKNOWN_LEADER_EPOCH"
    );
    let list_at = |epoch: i32| {
        ListOffsetsRequest::default()
            .with_replica_id((-1).into())
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(s("e")))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_current_leader_epoch(epoch)
                    .with_timestamp(-1)])])
    };
    let resp = conn.send(&list_at(9), 7).await.unwrap();
    assert_eq!(resp.topics[0].partitions[0].error_code, 75);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_for_leader_epoch_answers_where_each_epoch_ended() {
    let b = start().await;
    with_topic(&b, "oe", 1).await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    for _ in 0..3 {
        produce(&mut conn, "oe", 0, records(2, 0, ProducerIds::NONE), -1)
            .await
            .unwrap();
    }
    let ask = |epoch: i32, current: i32| {
        OffsetForLeaderEpochRequest::default()
            .with_replica_id((-1).into())
            .with_topics(vec![OffsetForLeaderTopic::default()
                .with_topic(TopicName(s("oe")))
                .with_partitions(vec![OffsetForLeaderPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(current)
                    .with_leader_epoch(epoch)])])
    };
    let answer = |r: kafka_protocol::messages::OffsetForLeaderEpochResponse| {
        let p = &r.topics[0].partitions[0];
        (p.error_code, p.leader_epoch, p.end_offset)
    };
    // a single node leads epoch 0 from offset 0: epoch 0 (and any later one) ends at the log end
    assert_eq!(answer(conn.send(&ask(0, 0), 4).await.unwrap()), (0, 0, 6));
    assert_eq!(answer(conn.send(&ask(7, -1), 4).await.unwrap()), (0, 0, 6));
    // a current epoch the broker has not reached is refused
    assert_eq!(answer(conn.send(&ask(0, 2), 4).await.unwrap()).0, 75);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_refuse_weaker_acks_and_acks_all_without_enough_in_sync_replicas() {
    let b = start().await;
    let mut admin = Admin::connect(&b.addr).await.unwrap();
    let configs = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    admin
        .create_topic("settle", Some(1), None, &configs(&[("min.acks", "all")]))
        .await
        .unwrap();
    admin
        .create_topic(
            "strict",
            Some(1),
            None,
            &configs(&[("min.insync.replicas", "2")]),
        )
        .await
        .unwrap();
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    let good = records(3, 1_700_000_000_000, ProducerIds::NONE);

    // min.acks=all: acks=1 is refused with INVALID_REQUIRED_ACKS, acks=all is taken
    assert_eq!(
        kafka_code(
            produce(&mut conn, "settle", 0, good.clone(), 1)
                .await
                .unwrap_err()
        ),
        21
    );
    assert_eq!(
        produce(&mut conn, "settle", 0, good.clone(), -1)
            .await
            .unwrap(),
        0
    );
    assert_eq!(list_offset(&mut conn, "settle", 0, -1).await.unwrap(), 3);

    // one replica, min.insync.replicas=2: acks=all is refused before append
    // (NOT_ENOUGH_REPLICAS), acks=1 is not bound by it
    assert_eq!(
        kafka_code(
            produce(&mut conn, "strict", 0, good.clone(), -1)
                .await
                .unwrap_err()
        ),
        19
    );
    assert_eq!(
        produce(&mut conn, "strict", 0, good.clone(), 1)
            .await
            .unwrap(),
        0
    );
    // acks=1 does not wait for the fsync that moves the high watermark
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while list_offset(&mut conn, "strict", 0, -1).await.unwrap() != 3 {
        assert!(tokio::time::Instant::now() < deadline, "HW never reached 3");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // an invalid min.acks is refused at creation
    assert!(admin
        .create_topic("bad", Some(1), None, &configs(&[("min.acks", "2")]))
        .await
        .is_err());
}

/// KIP-467: a batch refused for its records names each of them (`record_errors`), as Kafka
/// does for keyless records on a compacted topic (librdkafka's 0011 counts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_names_the_record_that_made_it_invalid() {
    let b = start().await;
    let mut admin = Admin::connect(&b.addr).await.unwrap();
    let configs = BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]);
    admin
        .create_topic("compacted", Some(1), None, &configs)
        .await
        .unwrap();
    let recs = [
        Rec {
            key: Some(b"k0"),
            value: Some(b"v0"),
            timestamp_delta: 0,
        },
        Rec {
            key: None,
            value: Some(b"v1"),
            timestamp_delta: 1,
        },
        Rec {
            key: Some(b"k2"),
            value: Some(b"v2"),
            timestamp_delta: 2,
        },
        Rec {
            key: None,
            value: Some(b"v3"),
            timestamp_delta: 3,
        },
    ];
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    let r = conn
        .send(
            &ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(5000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(s("compacted")))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(Bytes::from(batch(
                            1000,
                            ProducerIds::NONE,
                            &recs,
                        ))))])]),
            8,
        )
        .await
        .unwrap();
    let p = &r.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 87, "INVALID_RECORD");
    let indexes: Vec<i32> = p.record_errors.iter().map(|e| e.batch_index).collect();
    assert_eq!(
        indexes,
        vec![1, 3],
        "every keyless record is named (librdkafka's 0011 counts them): {:?}",
        p.record_errors
    );
    assert!(p.record_errors[0].batch_index_error_message.is_some());
    assert!(p.error_message.is_some());
}

/// KIP-227 through the listener: a full request opens a session, incremental ones carry only
/// what changed and hear only of partitions that changed; forgotten partitions stay out,
/// wrong epochs and unknown ids are refused, and epoch -1 closes the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_sessions_answer_only_what_changed() {
    use kafka_protocol::messages::fetch_request::ForgottenTopic;
    let b = start().await;
    with_topic(&b, "fs", 3).await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    produce(&mut conn, "fs", 0, records(2, 0, ProducerIds::NONE), -1)
        .await
        .unwrap();
    let part = |p: i32, offset: i64| {
        FetchPartition::default()
            .with_partition(p)
            .with_fetch_offset(offset)
            .with_partition_max_bytes(1 << 20)
    };
    let req = |id: i32, epoch: i32, parts: Vec<FetchPartition>| {
        FetchRequest::default()
            .with_max_wait_ms(50)
            .with_max_bytes(1 << 20)
            .with_session_id(id)
            .with_session_epoch(epoch)
            .with_topics(if parts.is_empty() {
                vec![]
            } else {
                vec![FetchTopic::default()
                    .with_topic(TopicName(s("fs")))
                    .with_partitions(parts)]
            })
    };
    // (partition, high watermark, bytes of records) of every partition answered
    let answered = |r: &kafka_protocol::messages::FetchResponse| -> Vec<(i32, i64, usize)> {
        r.responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .map(|p| {
                (
                    p.partition_index,
                    p.high_watermark,
                    p.records.as_ref().map_or(0, |r| r.len()),
                )
            })
            .collect()
    };

    // full, opening a session: all three answered, partition 0 with its records
    let full = conn
        .send(&req(0, 0, vec![part(0, 0), part(1, 0), part(2, 0)]), 12)
        .await
        .unwrap();
    let id = full.session_id;
    assert_ne!(id, 0, "no session opened");
    let got = answered(&full);
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got[0].2 > 0 && got[1].2 == 0, "{got:?}");

    // incremental, partition 0 at its new offset: nothing changed, nothing answered
    let r = conn.send(&req(id, 1, vec![part(0, 2)]), 12).await.unwrap();
    assert_eq!((r.error_code, r.session_id), (0, id));
    assert_eq!(answered(&r), vec![]);

    // records on partition 1: only it is answered, though nothing asked for it again
    produce(&mut conn, "fs", 1, records(3, 0, ProducerIds::NONE), -1)
        .await
        .unwrap();
    let r = conn.send(&req(id, 2, vec![]), 12).await.unwrap();
    let got = answered(&r);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].0, got[0].1), (1, 3));
    assert!(got[0].2 > 0);

    // an epoch that is not the next one, an unknown id: refused, the session still there
    let r = conn.send(&req(id, 2, vec![]), 12).await.unwrap();
    assert_eq!(r.error_code, 71, "INVALID_FETCH_SESSION_EPOCH");
    let r = conn.send(&req(id ^ 1, 3, vec![]), 12).await.unwrap();
    assert_eq!(r.error_code, 70, "FETCH_SESSION_ID_NOT_FOUND");

    // partition 2 forgotten: its new records are not answered, partition 1's offset moves on
    let forget =
        req(id, 3, vec![part(1, 3)]).with_forgotten_topics_data(vec![ForgottenTopic::default()
            .with_topic(TopicName(s("fs")))
            .with_partitions(vec![2])]);
    let r = conn.send(&forget, 12).await.unwrap();
    assert_eq!(answered(&r), vec![]);
    produce(&mut conn, "fs", 2, records(1, 0, ProducerIds::NONE), -1)
        .await
        .unwrap();
    produce(&mut conn, "fs", 0, records(1, 0, ProducerIds::NONE), -1)
        .await
        .unwrap();
    let r = conn.send(&req(id, 4, vec![]), 12).await.unwrap();
    let got = answered(&r);
    assert_eq!(
        got.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![0],
        "{got:?}"
    );
    assert_eq!(got[0].1, 3);

    // epoch -1 closes it: a sessionless full answer; the id is gone afterwards
    let r = conn
        .send(&req(id, -1, vec![part(0, 0), part(1, 0)]), 12)
        .await
        .unwrap();
    assert_eq!((r.error_code, r.session_id), (0, 0));
    assert_eq!(answered(&r).len(), 2);
    let r = conn.send(&req(id, 5, vec![]), 12).await.unwrap();
    assert_eq!(r.error_code, 70);

    // before v7 there are no sessions, whatever the fields say
    let r = conn.send(&req(0, 0, vec![part(0, 0)]), 6).await.unwrap();
    assert_eq!((r.error_code, r.session_id), (0, 0));
}
