use super::leases::{HeartbeatError, Leases};
use super::*;

fn register(m: &mut ClusterMetadata, index: u64, id: BrokerId, rack: Option<&str>) -> u64 {
    let cmd = Command::RegisterBroker {
        id,
        incarnation: Uuid::new_v4(),
        endpoints: vec![Endpoint {
            name: "kafka".into(),
            host: "127.0.0.1".into(),
            port: 9092 + id as u16,
        }],
        rack: rack.map(str::to_string),
    };
    match m.apply(index, &cmd).unwrap() {
        Applied::BrokerRegistered { epoch } => epoch,
        other => panic!("{other:?}"),
    }
}

fn create(
    m: &mut ClusterMetadata,
    index: u64,
    name: &str,
    partitions: u32,
    rf: u16,
) -> Result<Applied, MetadataError> {
    m.apply(
        index,
        &Command::CreateTopic {
            name: name.into(),
            id: Uuid::new_v4(),
            partitions,
            replication_factor: rf,
            configs: BTreeMap::new(),
            assignments: vec![],
        },
    )
}

fn three_brokers() -> (ClusterMetadata, Vec<u64>) {
    let mut m = ClusterMetadata::default();
    let epochs = (1..=3)
        .map(|id| register(&mut m, id as u64, id, None))
        .collect();
    (m, epochs)
}

#[test]
fn twelve_partitions_spread_leaders_over_all_brokers() {
    let (mut m, _) = three_brokers();
    create(&mut m, 10, "orders", 12, 3).unwrap();
    let t = &m.topics["orders"];
    let mut per_broker = BTreeMap::new();
    for p in &t.partitions {
        *per_broker.entry(p.leader.unwrap()).or_insert(0) += 1;
        assert_eq!(p.isr, p.replicas);
        assert_eq!(p.leader, Some(p.replicas[0]));
    }
    assert_eq!(per_broker.into_values().collect::<Vec<_>>(), vec![4, 4, 4]);
    assert_eq!(m.version, 10);
}

#[test]
fn creating_a_topic_again_is_a_no_op_or_a_clear_refusal() {
    let (mut m, _) = three_brokers();
    let first = create(&mut m, 10, "t", 3, 2).unwrap();
    let Applied::TopicCreated { id, created: true } = first else {
        panic!("{first:?}")
    };
    assert_eq!(
        create(&mut m, 11, "t", 3, 2).unwrap(),
        Applied::TopicCreated { id, created: false }
    );
    let err = create(&mut m, 12, "t", 4, 2).unwrap_err();
    assert_eq!(
        err,
        MetadataError::TopicExists {
            name: "t".into(),
            partitions: 3,
            rf: 2
        }
    );
    assert!(err.to_string().contains("3 partitions"));
    assert_eq!(m.topics["t"].partitions.len(), 3);
    assert!(matches!(
        create(&mut m, 13, "big", 1, 4),
        Err(MetadataError::InvalidReplicationFactor(_))
    ));
    assert!(matches!(
        create(&mut m, 14, "none", 0, 1),
        Err(MetadataError::InvalidPartitions(_))
    ));
}

#[test]
fn fencing_the_leader_moves_leadership_within_the_isr_and_bumps_epochs() {
    let (mut m, epochs) = three_brokers();
    create(&mut m, 10, "t", 6, 3).unwrap();
    let before = m.topics["t"].partitions.clone();
    m.apply(
        11,
        &Command::FenceBroker {
            id: 1,
            epoch: epochs[0],
        },
    )
    .unwrap();
    for (old, new) in before.iter().zip(&m.topics["t"].partitions) {
        assert!(!new.isr.contains(&1));
        assert_ne!(new.leader, Some(1));
        assert!(new.leader.is_some_and(|l| new.isr.contains(&l)));
        if old.leader == Some(1) {
            assert_eq!(new.leader_epoch, old.leader_epoch + 1);
            // the next replica in preference order that is in the ISR
            assert_eq!(new.leader, old.replicas.iter().copied().find(|r| *r != 1));
        } else {
            assert_eq!(new.leader, old.leader);
            assert_eq!(new.leader_epoch, old.leader_epoch);
        }
        assert!(new.partition_epoch > old.partition_epoch);
    }
    assert!(m.offline_partitions().is_empty());
}

#[test]
fn rf1_partitions_go_offline_and_come_back_with_their_broker() {
    let (mut m, epochs) = three_brokers();
    create(&mut m, 10, "single", 3, 1).unwrap();
    let on_2: Vec<u32> = (0..3)
        .filter(|&i| m.topics["single"].partitions[i as usize].replicas == [2])
        .collect();
    assert_eq!(on_2.len(), 1);
    m.apply(
        11,
        &Command::FenceBroker {
            id: 2,
            epoch: epochs[1],
        },
    )
    .unwrap();
    let offline = m.offline_partitions();
    assert_eq!(offline, vec![("single".to_string(), on_2[0])]);
    let p = &m.topics["single"].partitions[on_2[0] as usize];
    assert_eq!(
        p.isr,
        vec![2],
        "the last ISR member stays, so it can lead again cleanly"
    );
    let epoch_offline = p.leader_epoch;
    // the broker restarts: a new incarnation registers and takes its partition back
    register(&mut m, 12, 2, None);
    let p = &m.topics["single"].partitions[on_2[0] as usize];
    assert_eq!(p.leader, Some(2));
    assert_eq!(p.leader_epoch, epoch_offline + 1);
    assert!(m.offline_partitions().is_empty());
}

#[test]
fn a_new_incarnation_fences_the_old_one_and_stale_epochs_are_refused() {
    let (mut m, epochs) = three_brokers();
    create(&mut m, 10, "t", 3, 3).unwrap();
    let led_by_1: Vec<i32> = m.topics["t"]
        .partitions
        .iter()
        .filter(|p| p.leader == Some(1))
        .map(|p| p.leader_epoch)
        .collect();
    let new_epoch = register(&mut m, 11, 1, None);
    assert_eq!(new_epoch, 11);
    // leadership moved off the old incarnation (epoch bumped)
    for p in &m.topics["t"].partitions {
        assert_ne!(p.leader, Some(1));
    }
    assert_eq!(led_by_1.len(), 1);
    assert_eq!(
        m.apply(
            12,
            &Command::FenceBroker {
                id: 1,
                epoch: epochs[0]
            }
        ),
        Err(MetadataError::StaleBrokerEpoch {
            id: 1,
            current: 11,
            got: epochs[0]
        })
    );
    assert!(matches!(
        m.apply(
            13,
            &Command::AllocateProducerIds {
                broker: 1,
                epoch: epochs[0],
                count: 10
            }
        ),
        Err(MetadataError::StaleBrokerEpoch { .. })
    ));
    assert!(matches!(
        m.apply(14, &Command::FenceBroker { id: 9, epoch: 1 }),
        Err(MetadataError::UnknownBroker(9))
    ));
}

#[test]
fn unclean_election_only_when_the_topic_allows_it() {
    let (mut m, epochs) = three_brokers();
    let mut configs = BTreeMap::new();
    configs.insert(UNCLEAN_ELECTION_CONFIG.to_string(), "true".to_string());
    m.apply(
        10,
        &Command::CreateTopic {
            name: "lossy".into(),
            id: Uuid::new_v4(),
            partitions: 1,
            replication_factor: 2,
            configs,
            assignments: vec![],
        },
    )
    .unwrap();
    create(&mut m, 11, "safe", 1, 2).unwrap();
    for name in ["lossy", "safe"] {
        let p = &m.topics[name].partitions[0];
        let (leader, follower) = (p.leader.unwrap(), p.replicas[1]);
        let epoch = m.topics[name].partitions[0].partition_epoch;
        // the follower falls out of the ISR first
        m.apply(
            12,
            &Command::AlterIsr {
                topic: name.into(),
                partition: 0,
                leader,
                leader_epoch: 0,
                partition_epoch: epoch,
                isr: vec![leader],
                joining: vec![],
            },
        )
        .unwrap();
        let _ = follower;
    }
    // now fence broker(s) leading both partitions
    let leaders: Vec<BrokerId> = ["lossy", "safe"]
        .iter()
        .map(|n| m.topics[*n].partitions[0].leader.unwrap())
        .collect();
    for l in leaders.iter().collect::<std::collections::BTreeSet<_>>() {
        m.apply(
            13,
            &Command::FenceBroker {
                id: *l,
                epoch: epochs[(*l - 1) as usize],
            },
        )
        .unwrap();
    }
    let lossy = &m.topics["lossy"].partitions[0];
    let safe = &m.topics["safe"].partitions[0];
    if lossy.replicas.iter().any(|r| !leaders.contains(r)) {
        assert!(
            lossy.leader.is_some(),
            "unclean election picks a live out-of-sync replica"
        );
        assert_eq!(lossy.isr, vec![lossy.leader.unwrap()]);
    }
    if safe.replicas.iter().any(|r| !leaders.contains(r)) {
        assert_eq!(
            safe.leader, None,
            "a clean topic stays offline rather than lose data"
        );
    }
}

#[test]
fn a_member_that_caught_up_as_an_older_registration_cannot_join() {
    // KIP-903: broker 3 caught up, was removed, then restarted (perhaps on an empty disk)
    // before the leader saw its new process fetch. The leader's proposal names the
    // registration that caught up; the controllers refuse it once that is not 3's own.
    let (mut m, epochs) = three_brokers();
    create(&mut m, 10, "t", 1, 3).unwrap();
    let p = m.topics["t"].partitions[0].clone();
    let leader = p.leader.unwrap();
    let other = *p.replicas.iter().find(|r| **r != leader).unwrap();
    let rest: Vec<BrokerId> = p.replicas.iter().copied().filter(|r| *r != other).collect();
    let alter = |pe: i32, isr: Vec<BrokerId>, joining: Vec<(BrokerId, u64)>| Command::AlterIsr {
        topic: "t".into(),
        partition: 0,
        leader,
        leader_epoch: 0,
        partition_epoch: pe,
        isr,
        joining,
    };
    m.apply(11, &alter(0, rest.clone(), vec![])).unwrap();
    let old = epochs[(other - 1) as usize];
    let new = register(&mut m, 12, other, None);
    let pe = m.topics["t"].partitions[0].partition_epoch;
    let err = m
        .apply(13, &alter(pe, p.replicas.clone(), vec![(other, old)]))
        .unwrap_err();
    assert!(
        matches!(&err, MetadataError::InvalidIsr { reason, .. } if reason.contains("registered again")),
        "{err}"
    );
    assert_eq!(m.topics["t"].partitions[0].isr, rest);
    // once the new process caught up, it joins
    m.apply(14, &alter(pe, p.replicas.clone(), vec![(other, new)]))
        .unwrap();
    assert_eq!(m.topics["t"].partitions[0].isr, p.replicas);
}

#[test]
fn alter_isr_is_a_compare_and_set_on_the_partition_epoch() {
    let (mut m, epochs) = three_brokers();
    create(&mut m, 10, "t", 1, 3).unwrap();
    let p = m.topics["t"].partitions[0].clone();
    let leader = p.leader.unwrap();
    let shrink = |pe: i32, isr: Vec<BrokerId>| Command::AlterIsr {
        topic: "t".into(),
        partition: 0,
        leader,
        leader_epoch: 0,
        partition_epoch: pe,
        isr,
        joining: vec![],
    };
    let without: Vec<BrokerId> = p
        .replicas
        .iter()
        .copied()
        .filter(|r| *r != p.replicas[2])
        .collect();
    assert_eq!(
        m.apply(11, &shrink(0, without.clone())).unwrap(),
        Applied::PartitionUpdated {
            leader_epoch: 0,
            partition_epoch: 1
        }
    );
    // the same proposal again is stale
    assert_eq!(
        m.apply(12, &shrink(0, without.clone())),
        Err(MetadataError::StalePartitionEpoch { current: 1, got: 0 })
    );
    // the leader must stay; members must be replicas; a fenced broker cannot rejoin
    assert!(matches!(
        m.apply(13, &shrink(1, vec![p.replicas[1]])),
        Err(MetadataError::InvalidIsr { .. })
    ));
    assert!(matches!(
        m.apply(13, &shrink(1, vec![leader, 42])),
        Err(MetadataError::InvalidIsr { .. })
    ));
    let out = p.replicas[2];
    m.apply(
        14,
        &Command::FenceBroker {
            id: out,
            epoch: epochs[(out - 1) as usize],
        },
    )
    .unwrap();
    let pe = m.topics["t"].partitions[0].partition_epoch;
    assert!(matches!(
        m.apply(15, &shrink(pe, p.replicas.clone())),
        Err(MetadataError::InvalidIsr { .. })
    ));
    // a non-leader cannot change it
    let other = p.replicas[1];
    assert!(matches!(
        m.apply(
            16,
            &Command::AlterIsr {
                topic: "t".into(),
                partition: 0,
                leader: other,
                leader_epoch: 0,
                partition_epoch: pe,
                isr: vec![other],
                joining: vec![],
            }
        ),
        Err(MetadataError::NotLeader { .. })
    ));
}

#[test]
fn producer_id_blocks_never_overlap_and_partitions_can_be_added() {
    let (mut m, epochs) = three_brokers();
    let a = m
        .apply(
            10,
            &Command::AllocateProducerIds {
                broker: 1,
                epoch: epochs[0],
                count: 1000,
            },
        )
        .unwrap();
    let b = m
        .apply(
            11,
            &Command::AllocateProducerIds {
                broker: 2,
                epoch: epochs[1],
                count: 1000,
            },
        )
        .unwrap();
    assert_eq!(
        a,
        Applied::ProducerIds {
            first: 0,
            count: 1000
        }
    );
    assert_eq!(
        b,
        Applied::ProducerIds {
            first: 1000,
            count: 1000
        }
    );
    create(&mut m, 12, "t", 2, 2).unwrap();
    m.apply(
        13,
        &Command::CreatePartitions {
            name: "t".into(),
            total: 5,
            assignments: vec![],
        },
    )
    .unwrap();
    assert_eq!(m.topics["t"].partitions.len(), 5);
    assert!(matches!(
        m.apply(
            14,
            &Command::CreatePartitions {
                name: "t".into(),
                total: 5,
                assignments: vec![],
            }
        ),
        Err(MetadataError::InvalidPartitions(_))
    ));
    m.apply(15, &Command::DeleteTopic { name: "t".into() })
        .unwrap();
    assert_eq!(
        m.apply(16, &Command::DeleteTopic { name: "t".into() }),
        Err(MetadataError::UnknownTopic("t".into()))
    );
}

#[test]
fn replaying_the_same_log_gives_the_same_state() {
    let build = || {
        let mut m = ClusterMetadata::default();
        let ids: Vec<Uuid> = (0..4).map(|i| Uuid::from_u128(i as u128 + 1)).collect();
        let mut log = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            log.push(Command::RegisterBroker {
                id: i as i32 + 1,
                incarnation: *id,
                endpoints: vec![],
                rack: Some(format!("r{}", i % 2)),
            });
        }
        log.push(Command::CreateTopic {
            name: "a".into(),
            id: Uuid::from_u128(9),
            partitions: 7,
            replication_factor: 3,
            configs: BTreeMap::new(),
            assignments: vec![],
        });
        log.push(Command::FenceBroker { id: 2, epoch: 2 });
        log.push(Command::CreateTopic {
            name: "b".into(),
            id: Uuid::from_u128(10),
            partitions: 5,
            replication_factor: 2,
            configs: BTreeMap::new(),
            assignments: vec![],
        });
        for (i, c) in log.iter().enumerate() {
            let _ = m.apply(i as u64 + 1, c);
        }
        m
    };
    assert_eq!(build(), build());
}

#[test]
fn leases_expire_into_fencing_and_a_new_controller_grants_grace() {
    let (mut m, epochs) = three_brokers();
    let mut leases = Leases::new(1_000);
    leases.grant_all(&m, 0);
    assert!(leases.expired(&m, 999).is_empty());
    assert_eq!(leases.heartbeat(&m, 1, epochs[0], 500), Ok(false));
    assert_eq!(leases.heartbeat(&m, 2, epochs[1], 500), Ok(false));
    assert_eq!(leases.expired(&m, 1_000), vec![(3, epochs[2])]);
    assert_eq!(
        leases.heartbeat(&m, 3, 999, 1_000),
        Err(HeartbeatError::StaleEpoch {
            id: 3,
            current: epochs[2],
            got: 999
        })
    );
    assert_eq!(
        leases.heartbeat(&m, 7, 1, 1_000),
        Err(HeartbeatError::UnknownBroker(7))
    );
    m.apply(
        10,
        &Command::FenceBroker {
            id: 3,
            epoch: epochs[2],
        },
    )
    .unwrap();
    assert!(
        leases.expired(&m, 1_200).is_empty(),
        "a fenced broker is not fenced twice"
    );
    // a fenced broker that heartbeats again asks to be unfenced
    assert_eq!(leases.heartbeat(&m, 3, epochs[2], 1_300), Ok(true));
    // failover: the new active controller gives everyone a full lease first
    let mut next = Leases::new(1_000);
    next.grant_all(&m, 5_000);
    assert!(next.expired(&m, 5_999).is_empty());
    assert_eq!(next.expired(&m, 6_000).len(), 2);
}

fn credential(key_len: usize, iterations: u32) -> ScramCredential {
    ScramCredential {
        salt: vec![7; 16],
        iterations,
        stored_key: vec![1; key_len],
        server_key: vec![2; key_len],
    }
}

#[test]
fn scram_credentials_are_set_checked_and_deleted() {
    let mut m = ClusterMetadata::default();
    let upsert = |user: &str, mechanism, c| Command::UpsertScramCredential {
        user: user.into(),
        mechanism,
        credential: c,
    };
    assert_eq!(
        m.apply(
            1,
            &upsert("alice", ScramMechanism::Sha512, credential(64, 8192))
        ),
        Ok(Applied::Done)
    );
    // keys of the wrong length, iterations out of range, odd names: refused, nothing changes
    for (i, bad) in [
        upsert("alice", ScramMechanism::Sha256, credential(64, 8192)),
        upsert("alice", ScramMechanism::Sha256, credential(32, 100)),
        upsert("", ScramMechanism::Sha256, credential(32, 8192)),
        upsert("a\u{1b}b", ScramMechanism::Sha256, credential(32, 8192)),
    ]
    .into_iter()
    .enumerate()
    {
        assert!(matches!(
            m.apply(2 + i as u64, &bad),
            Err(MetadataError::InvalidScramCredential(_))
        ));
    }
    assert_eq!(m.scram_credentials["alice"].len(), 1);
    // the first credential stored gives the stand-in credentials' key, which outlives it
    assert_eq!(m.scram_mock_secret.as_deref(), Some(&vec![2; 64][..]));
    let key = m.scram_mock_key().to_vec();
    let delete = |mechanism| Command::DeleteScramCredential {
        user: "alice".into(),
        mechanism,
    };
    assert!(matches!(
        m.apply(10, &delete(ScramMechanism::Sha256)),
        Err(MetadataError::UnknownScramCredential { .. })
    ));
    assert_eq!(
        m.apply(11, &delete(ScramMechanism::Sha512)),
        Ok(Applied::Done)
    );
    assert!(m.scram_credentials.is_empty());
    assert_eq!(
        m.scram_mock_key(),
        key,
        "kept when its credential is deleted"
    );
}

#[test]
fn metadata_written_before_credentials_existed_still_loads() {
    let mut json = serde_json::to_value(ClusterMetadata::default()).unwrap();
    json.as_object_mut().unwrap().remove("scram_credentials");
    let m: ClusterMetadata = serde_json::from_value(json).unwrap();
    assert!(m.scram_credentials.is_empty());
    assert!(m.scram_mock_key().is_empty(), "no user, no key");
}

#[test]
fn metadata_written_before_the_mock_secret_derives_a_stable_key_from_its_users() {
    let mut m = ClusterMetadata::default();
    for (user, server_key) in [("bob", 5u8), ("alice", 4u8)] {
        let mut c = credential(64, 8192);
        c.server_key = vec![server_key; 64];
        m.scram_credentials
            .entry(user.into())
            .or_default()
            .insert(ScramMechanism::Sha512, c);
    }
    let json = serde_json::to_value(&m).unwrap();
    assert!(
        json.get("scram_mock_secret").is_none(),
        "absent, as in older metadata"
    );
    let old: ClusterMetadata = serde_json::from_value(json).unwrap();
    assert_eq!(old.scram_mock_key(), &[4u8; 64][..], "the first user's key");
}

#[test]
fn acls_are_added_all_or_none_and_deleted_by_filter() {
    use acl::*;
    let mut m = ClusterMetadata::default();
    let binding = |name: &str, principal: &str| AclBinding {
        resource_type: ResourceType::Topic,
        name: name.into(),
        pattern: PatternType::Literal,
        principal: principal.into(),
        host: "*".into(),
        operation: Operation::Read,
        permission: Permission::Allow,
    };
    let create = |acls| Command::CreateAcls { acls };
    assert!(matches!(
        m.apply(
            1,
            &create(vec![binding("t", "User:a"), binding("t", "no-colon")])
        ),
        Err(MetadataError::InvalidAcl(_))
    ));
    assert!(m.acls.is_empty(), "one bad binding refuses them all");
    m.apply(
        2,
        &create(vec![
            binding("t", "User:a"),
            binding("u", "User:a"),
            binding("t", "User:b"),
        ]),
    )
    .unwrap();
    let deleted = m
        .apply(
            3,
            &Command::DeleteAcls {
                filters: vec![AclFilter {
                    principal: Some("User:a".into()),
                    ..AclFilter::default()
                }],
            },
        )
        .unwrap();
    assert!(matches!(deleted, Applied::AclsDeleted(d) if d.len() == 2));
    assert_eq!(
        m.acls
            .iter()
            .map(|a| a.principal.as_str())
            .collect::<Vec<_>>(),
        ["User:b"]
    );
}

/// Issue 17: `CreatePartitions` with 4,000,000,000 partitions aborted every controller
/// (`memory allocation of 96000000000 bytes failed`), and again at every restart, since the
/// entry was in the log. Every number that sizes something is checked before it is used,
/// in `apply` too, so an entry already in a log is refused the same way on every replica.
#[test]
fn commands_with_unbounded_numbers_or_invalid_configs_are_refused_without_a_change() {
    let (mut m, epochs) = three_brokers();
    create(&mut m, 10, "settlements", 3, 3).unwrap();
    let before = m.clone();
    let refused = |m: &mut ClusterMetadata, index, cmd: Command| {
        let err = m.apply(index, &cmd).expect_err("refused");
        assert_eq!(
            cmd.validate(),
            Err(err.clone()),
            "validate() refuses it the same way"
        );
        err
    };
    let huge = refused(
        &mut m,
        11,
        Command::CreatePartitions {
            name: "settlements".into(),
            total: 4_000_000_000,
            assignments: vec![],
        },
    );
    assert!(
        matches!(huge, MetadataError::InvalidPartitions(_)),
        "{huge}"
    );
    assert!(huge.to_string().contains("10000"), "{huge}");
    for partitions in [0, 50_000, u32::MAX] {
        let e = refused(
            &mut m,
            12,
            Command::CreateTopic {
                name: "clicks".into(),
                id: Uuid::new_v4(),
                partitions,
                replication_factor: 3,
                configs: BTreeMap::new(),
                assignments: vec![],
            },
        );
        assert!(matches!(e, MetadataError::InvalidPartitions(_)), "{e}");
    }
    let e = refused(
        &mut m,
        13,
        Command::CreateTopic {
            name: "clicks".into(),
            id: Uuid::new_v4(),
            partitions: 1,
            replication_factor: 3,
            configs: [("min.insync.replicas".to_string(), "two".to_string())].into(),
            assignments: vec![],
        },
    );
    assert!(
        matches!(&e, MetadataError::InvalidConfig(s) if s.contains("min.insync.replicas")),
        "{e}"
    );
    let e = refused(
        &mut m,
        14,
        Command::CreateTopic {
            name: "bad/name".into(),
            id: Uuid::new_v4(),
            partitions: 1,
            replication_factor: 1,
            configs: BTreeMap::new(),
            assignments: vec![],
        },
    );
    assert!(matches!(e, MetadataError::InvalidRequest(_)), "{e}");
    let e = refused(
        &mut m,
        15,
        Command::AlterTopicConfigs {
            name: "settlements".into(),
            set: [("retention.ms".to_string(), "soon".to_string())].into(),
            remove: vec![],
        },
    );
    assert!(matches!(e, MetadataError::InvalidConfig(_)), "{e}");
    for count in [0, MAX_PRODUCER_ID_BLOCK + 1] {
        let e = refused(
            &mut m,
            16,
            Command::AllocateProducerIds {
                broker: 1,
                epoch: epochs[0],
                count,
            },
        );
        assert!(matches!(e, MetadataError::InvalidRequest(_)), "{e}");
    }
    m.version = before.version;
    assert_eq!(
        m, before,
        "a refused command changes nothing but the version"
    );
}

/// A config that is valid on its own but not with the topic's current ones is refused
/// whole, leaving the topic as it was.
#[test]
fn a_config_change_is_checked_against_the_topic_it_lands_on() {
    let (mut m, _) = three_brokers();
    m.apply(
        10,
        &Command::CreateTopic {
            name: "settlements".into(),
            id: Uuid::new_v4(),
            partitions: 1,
            replication_factor: 3,
            configs: [("min.insync.replicas".to_string(), "2".to_string())].into(),
            assignments: vec![],
        },
    )
    .unwrap();
    let e = m
        .apply(
            11,
            &Command::AlterTopicConfigs {
                name: "settlements".into(),
                set: [("flush.messages".to_string(), "-5".to_string())].into(),
                remove: vec!["min.insync.replicas".into()],
            },
        )
        .unwrap_err();
    assert!(matches!(e, MetadataError::InvalidConfig(_)), "{e}");
    assert_eq!(m.topics["settlements"].configs["min.insync.replicas"], "2");
}

#[test]
fn client_quotas_are_altered_all_or_none_and_survive_a_snapshot() {
    use quota::*;
    let mut m = ClusterMetadata::default();
    let alteration = |client: &str, v: f64| QuotaAlteration {
        entity: QuotaEntity {
            user: None,
            client_id: Some(EntityName::Named(client.into())),
        },
        set: [(QuotaKey::ProducerByteRate, QuotaValue::new(v).unwrap())].into(),
        remove: vec![],
    };
    let nameless = QuotaAlteration {
        entity: QuotaEntity {
            user: None,
            client_id: None,
        },
        set: BTreeMap::new(),
        remove: vec![],
    };
    let cmd = |alterations| Command::AlterClientQuotas { alterations };
    assert!(matches!(
        m.apply(1, &cmd(vec![alteration("a", 10.0), nameless])),
        Err(MetadataError::InvalidQuota(_))
    ));
    assert!(
        m.client_quotas.is_empty(),
        "one bad alteration refuses them all"
    );
    m.apply(2, &cmd(vec![alteration("a", 10.0), alteration("b", 20.0)]))
        .unwrap();
    assert_eq!(
        m.client_quotas
            .resolve("anyone", "b", QuotaKey::ProducerByteRate)
            .map(|(_, v)| v),
        Some(20.0)
    );
    let snapshot: ClusterMetadata =
        serde_json::from_slice(&serde_json::to_vec(&m).unwrap()).unwrap();
    assert_eq!(snapshot, m);
    // metadata written before quotas existed still loads
    let mut old = serde_json::to_value(ClusterMetadata::default()).unwrap();
    old.as_object_mut().unwrap().remove("client_quotas");
    assert!(serde_json::from_value::<ClusterMetadata>(old).is_ok());
}

/// Kafka's CreatePartitions with a manual assignment (librdkafka's 0081): the new
/// partitions get exactly the replicas asked for, the first leading; an assignment of the
/// wrong size, replication factor, an unknown broker or a repeated one is refused whole.
#[test]
fn partitions_added_with_a_manual_assignment_get_those_replicas() {
    let (mut m, _) = three_brokers();
    create(&mut m, 10, "t", 1, 2).unwrap();
    let add = |assignments: Vec<Vec<BrokerId>>, total| Command::CreatePartitions {
        name: "t".into(),
        total,
        assignments,
    };
    for (i, (bad, total)) in [
        (vec![vec![1, 2]], 3),    // two new partitions, one assignment
        (vec![vec![1, 2, 3]], 2), // three replicas on a topic of two
        (vec![vec![1, 9]], 2),    // broker 9 is not registered
    ]
    .into_iter()
    .enumerate()
    {
        let e = m
            .apply(11 + i as u64, &add(bad.clone(), total))
            .unwrap_err();
        assert!(
            matches!(e, MetadataError::InvalidReplicaAssignment(_)),
            "{bad:?}: {e}"
        );
        assert_eq!(
            m.topics["t"].partitions.len(),
            1,
            "{bad:?} changed the topic"
        );
    }
    let e = add(vec![vec![2, 2]], 2).validate().unwrap_err();
    assert!(
        matches!(e, MetadataError::InvalidReplicaAssignment(_)),
        "{e}"
    );

    m.apply(20, &add(vec![vec![3, 1], vec![2, 3]], 3)).unwrap();
    let p = &m.topics["t"].partitions;
    assert_eq!((p[1].replicas.clone(), p[1].leader), (vec![3, 1], Some(3)));
    assert_eq!((p[2].replicas.clone(), p[2].leader), (vec![2, 3], Some(2)));
    assert_eq!(p[2].isr, vec![2, 3]);
    // an entry without assignments reads as before the field existed
    let json = serde_json::to_string(&add(vec![], 4)).unwrap();
    assert!(!json.contains("assignments"), "{json}");
}

/// CreateTopics with a manual assignment: the partitions get those replicas; a wrong size,
/// repeated or unregistered broker is refused and no topic appears.
#[test]
fn a_topic_created_with_a_manual_assignment_gets_those_replicas() {
    let (mut m, _) = three_brokers();
    let create = |assignments: Vec<Vec<BrokerId>>| Command::CreateTopic {
        name: "placed".into(),
        id: Uuid::new_v4(),
        partitions: assignments.len() as u32,
        replication_factor: assignments.first().map_or(1, |r| r.len() as u16),
        configs: BTreeMap::new(),
        assignments,
    };
    for (i, bad) in [
        vec![vec![1, 2], vec![3]],
        vec![vec![1, 1]],
        vec![vec![1, 7]],
    ]
    .into_iter()
    .enumerate()
    {
        let e = m.apply(10 + i as u64, &create(bad.clone())).unwrap_err();
        assert!(
            matches!(e, MetadataError::InvalidReplicaAssignment(_)),
            "{bad:?}: {e}"
        );
        assert!(
            !m.topics.contains_key("placed"),
            "{bad:?} created the topic"
        );
    }
    m.apply(20, &create(vec![vec![2, 3], vec![3, 1]])).unwrap();
    let p = &m.topics["placed"].partitions;
    assert_eq!((p[0].replicas.clone(), p[0].leader), (vec![2, 3], Some(2)));
    assert_eq!((p[1].replicas.clone(), p[1].leader), (vec![3, 1], Some(3)));
}

#[test]
fn elect_leaders_moves_leadership_to_the_preferred_replica_only_when_it_can_lead() {
    let (mut m, epochs) = three_brokers();
    create(&mut m, 10, "t", 1, 3).unwrap();
    let preferred = m.topics["t"].partitions[0].replicas[0];
    let elect = |m: &mut ClusterMetadata, index, unclean| {
        m.apply(
            index,
            &Command::ElectLeader {
                topic: "t".into(),
                partition: 0,
                unclean,
            },
        )
    };
    assert!(matches!(
        elect(&mut m, 11, false),
        Err(MetadataError::ElectionNotNeeded { .. })
    ));
    // The preferred leader is fenced: leadership moves away, and it cannot be elected
    // while fenced, nor once back until the leader takes it into the ISR again.
    let epoch = epochs[(preferred - 1) as usize];
    m.apply(
        12,
        &Command::FenceBroker {
            id: preferred,
            epoch,
        },
    )
    .unwrap();
    let moved = m.topics["t"].partitions[0].clone();
    assert_ne!(moved.leader, Some(preferred));
    let refused = elect(&mut m, 13, false).unwrap_err();
    assert!(
        matches!(&refused, MetadataError::PreferredLeaderNotAvailable { reason, .. } if reason == "fenced"),
        "{refused}"
    );
    m.apply(
        14,
        &Command::UnfenceBroker {
            id: preferred,
            epoch,
        },
    )
    .unwrap();
    assert!(matches!(
        elect(&mut m, 15, false),
        Err(MetadataError::PreferredLeaderNotAvailable { .. })
    ));
    assert_eq!(
        m.topics["t"].partitions[0], moved,
        "a refused election changes nothing"
    );
    let mut isr = moved.isr.clone();
    isr.push(preferred);
    m.apply(
        16,
        &Command::AlterIsr {
            topic: "t".into(),
            partition: 0,
            leader: moved.leader.unwrap(),
            leader_epoch: moved.leader_epoch,
            partition_epoch: moved.partition_epoch,
            isr,
            joining: vec![],
        },
    )
    .unwrap();
    let Applied::PartitionUpdated { leader_epoch, .. } = elect(&mut m, 17, false).unwrap() else {
        panic!("not a partition update")
    };
    let p = &m.topics["t"].partitions[0];
    assert_eq!((p.leader, p.leader_epoch), (Some(preferred), leader_epoch));
    assert_eq!(
        leader_epoch,
        moved.leader_epoch + 1,
        "a new leader epoch fences the old leader"
    );
    // Unclean: not needed while a leader is there.
    assert!(matches!(
        elect(&mut m, 18, true),
        Err(MetadataError::ElectionNotNeeded { .. })
    ));
    assert!(matches!(
        m.apply(
            19,
            &Command::ElectLeader {
                topic: "t".into(),
                partition: 1,
                unclean: false
            }
        ),
        Err(MetadataError::UnknownPartition { .. })
    ));
}

#[test]
fn an_unclean_election_brings_an_offline_partition_back_only_when_asked() {
    let (mut m, epochs) = three_brokers();
    create(&mut m, 10, "t", 1, 3).unwrap();
    let replicas = m.topics["t"].partitions[0].replicas.clone();
    // The ISR shrinks to the first replica, which then dies: offline (the topic does not
    // allow unclean election on its own).
    let p = m.topics["t"].partitions[0].clone();
    m.apply(
        11,
        &Command::AlterIsr {
            topic: "t".into(),
            partition: 0,
            leader: replicas[0],
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            isr: vec![replicas[0]],
            joining: vec![],
        },
    )
    .unwrap();
    let fence = |m: &mut ClusterMetadata, index, id: BrokerId| {
        m.apply(
            index,
            &Command::FenceBroker {
                id,
                epoch: epochs[(id - 1) as usize],
            },
        )
        .unwrap()
    };
    for (i, r) in replicas.iter().enumerate() {
        fence(&mut m, 12 + i as u64, *r);
    }
    let unclean = |m: &mut ClusterMetadata, index| {
        m.apply(
            index,
            &Command::ElectLeader {
                topic: "t".into(),
                partition: 0,
                unclean: true,
            },
        )
    };
    assert!(matches!(
        unclean(&mut m, 20),
        Err(MetadataError::EligibleLeadersNotAvailable { .. })
    ));
    let second = replicas[1];
    m.apply(
        21,
        &Command::UnfenceBroker {
            id: second,
            epoch: epochs[(second - 1) as usize],
        },
    )
    .unwrap();
    assert_eq!(m.topics["t"].partitions[0].leader, None, "not on its own");
    unclean(&mut m, 22).unwrap();
    let p = &m.topics["t"].partitions[0];
    assert_eq!((p.leader, p.isr.clone()), (Some(second), vec![second]));
}

fn reassign(
    m: &mut ClusterMetadata,
    index: u64,
    target: Option<Vec<BrokerId>>,
) -> Result<Applied, MetadataError> {
    m.apply(
        index,
        &Command::ReassignPartition {
            topic: "mv".into(),
            partition: 0,
            target,
            throttle: None,
        },
    )
}

/// The partition's leader proposes `isr` at its current epochs.
fn alter_isr(
    m: &mut ClusterMetadata,
    index: u64,
    isr: Vec<BrokerId>,
) -> Result<Applied, MetadataError> {
    let p = m.topics["mv"].partitions[0].clone();
    m.apply(
        index,
        &Command::AlterIsr {
            topic: "mv".into(),
            partition: 0,
            leader: p.leader.unwrap(),
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            isr,
            joining: vec![],
        },
    )
}

#[test]
fn a_reassignment_adds_replicas_then_completes_once_they_are_in_sync() {
    let (mut m, _) = three_brokers();
    register(&mut m, 4, 4, None);
    m.apply(
        10,
        &Command::CreateTopic {
            name: "mv".into(),
            id: Uuid::new_v4(),
            partitions: 1,
            replication_factor: 2,
            configs: BTreeMap::new(),
            assignments: vec![vec![1, 2]],
        },
    )
    .unwrap();
    // 1,2 -> 3,4: the leader (1) stays while 3 and 4 copy; a new leader epoch.
    reassign(&mut m, 11, Some(vec![3, 4])).unwrap();
    let p = m.topics["mv"].partitions[0].clone();
    assert_eq!(p.replicas, vec![3, 4, 1, 2]);
    assert_eq!((p.leader, p.isr.clone()), (Some(1), vec![1, 2]));
    assert_eq!(p.leader_epoch, 1);
    let r = p.reassignment.clone().unwrap();
    assert_eq!((r.adding(), r.removing()), (vec![3, 4], vec![1, 2]));
    // a member that is not a replica cannot join; 3 joins: not done yet
    assert!(alter_isr(&mut m, 12, vec![1, 2, 5]).is_err());
    alter_isr(&mut m, 13, vec![1, 2, 3]).unwrap();
    assert!(m.topics["mv"].partitions[0].reassignment.is_some());
    // 4 joins: done. The target replicas alone; the leader was leaving, so 3 leads.
    alter_isr(&mut m, 14, vec![1, 2, 3, 4]).unwrap();
    let p = m.topics["mv"].partitions[0].clone();
    assert_eq!(p.reassignment, None);
    assert_eq!(
        (p.replicas.clone(), p.isr.clone()),
        (vec![3, 4], vec![3, 4])
    );
    assert_eq!((p.leader, p.leader_epoch), (Some(3), 2));
    // moving to where it is: nothing happens; cancelling nothing: Kafka's error
    reassign(&mut m, 15, Some(vec![3, 4])).unwrap();
    assert_eq!(m.topics["mv"].partitions[0], p);
    assert!(matches!(
        reassign(&mut m, 16, None),
        Err(MetadataError::NoReassignmentInProgress { .. })
    ));
}

#[test]
fn a_cancelled_reassignment_returns_to_the_original_replicas() {
    let (mut m, _) = three_brokers();
    m.apply(
        10,
        &Command::CreateTopic {
            name: "mv".into(),
            id: Uuid::new_v4(),
            partitions: 1,
            replication_factor: 2,
            configs: BTreeMap::new(),
            assignments: vec![vec![1, 2]],
        },
    )
    .unwrap();
    let before = m.topics["mv"].partitions[0].clone();
    reassign(&mut m, 11, Some(vec![2, 3])).unwrap();
    assert_eq!(m.topics["mv"].partitions[0].replicas, vec![2, 3, 1]);
    // an unregistered broker and repeated brokers are refused, changing nothing
    let moving = m.topics["mv"].partitions[0].clone();
    assert!(matches!(
        reassign(&mut m, 12, Some(vec![2, 9])),
        Err(MetadataError::InvalidReplicaAssignment(_))
    ));
    assert!(matches!(
        reassign(&mut m, 13, Some(vec![3, 3])),
        Err(MetadataError::InvalidReplicaAssignment(_))
    ));
    assert_eq!(m.topics["mv"].partitions[0], moving);
    // cancelled before 3 caught up: back to 1,2 with 1 leading, at a new epoch
    reassign(&mut m, 14, None).unwrap();
    let p = m.topics["mv"].partitions[0].clone();
    assert_eq!(
        (p.replicas, p.isr, p.leader),
        (before.replicas.clone(), before.isr, Some(1))
    );
    assert!(p.leader_epoch > moving.leader_epoch && p.reassignment.is_none());

    // a move whose target is all in sync once it joins completes with that ISR change
    reassign(&mut m, 15, Some(vec![3])).unwrap();
    let p = m.topics["mv"].partitions[0].clone();
    assert_eq!(p.replicas, vec![3, 1, 2]);
    alter_isr(&mut m, 16, vec![1, 2, 3]).unwrap();
    let p = m.topics["mv"].partitions[0].clone();
    assert_eq!((p.replicas, p.leader), (vec![3], Some(3)), "completed");
}

#[test]
fn a_reassignment_that_drops_every_in_sync_replica_is_refused() {
    let (mut m, epochs) = three_brokers();
    m.apply(
        10,
        &Command::CreateTopic {
            name: "mv".into(),
            id: Uuid::new_v4(),
            partitions: 1,
            replication_factor: 1,
            configs: BTreeMap::new(),
            assignments: vec![vec![1]],
        },
    )
    .unwrap();
    // 1 -> 2, 3: 2 joins the ISR, then 1 is fenced, so 2 leads alone (3 still copying)
    reassign(&mut m, 11, Some(vec![2, 3])).unwrap();
    alter_isr(&mut m, 12, vec![1, 2]).unwrap();
    m.apply(
        13,
        &Command::FenceBroker {
            id: 1,
            epoch: epochs[0],
        },
    )
    .unwrap();
    let p = m.topics["mv"].partitions[0].clone();
    assert_eq!((p.leader, p.isr.clone()), (Some(2), vec![2]));
    // replacing the move with one to 3 alone would drop 2, the only in-sync replica
    let e = reassign(&mut m, 14, Some(vec![3])).unwrap_err();
    assert!(e.to_string().contains("in-sync"), "{e}");
    assert_eq!(m.topics["mv"].partitions[0], p);
    // and so would cancelling (back to 1 alone)
    assert!(reassign(&mut m, 15, None).is_err());
    // a throttle of 0 would never finish
    assert!(m
        .apply(
            16,
            &Command::ReassignPartition {
                topic: "mv".into(),
                partition: 0,
                target: Some(vec![2]),
                throttle: Some(0),
            },
        )
        .is_err());
}
