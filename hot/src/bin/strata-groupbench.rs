//! `strata-groupbench`: consumer group figures over the Kafka protocol, with group members
//! simulated in one process (each member its own connection, speaking JoinGroup, SyncGroup
//! and Heartbeat as a client does, the leader assigning round-robin):
//!
//! - rebalance time when a member joins a stable group of N: from the new member's first
//!   JoinGroup until every member has its assignment at the new generation;
//! - rebalance time when a member dies (stops without LeaveGroup): from its last heartbeat
//!   until the others have their new assignments; this includes the session timeout, which
//!   is printed beside it;
//! - offset commit throughput and latency: committers in their own groups commit every
//!   partition of the topic per request, each answered once replicated (acks=all).
//!
//! Figures, not assertions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Parser;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    FindCoordinatorRequest, GroupId, HeartbeatRequest, JoinGroupRequest, OffsetCommitRequest,
    SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use strata_client::groups::encode_assignment;
use strata_client::Connection;
use tokio::sync::{mpsc, watch};

#[derive(Parser)]
#[command(about = "Consumer group rebalance and offset commit figures")]
struct Args {
    /// Kafka listeners of the brokers (HOST:PORT, comma-separated).
    #[arg(long, value_delimiter = ',')]
    bootstrap: Vec<String>,
    /// An existing topic the groups "consume".
    #[arg(long)]
    topic: String,
    #[arg(long, default_value_t = 12)]
    partitions: i32,
    /// Group sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "4,32")]
    members: Vec<usize>,
    /// Joins and deaths measured per group size.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long, default_value_t = 1500)]
    session_timeout_ms: i32,
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// Concurrent committers and how long they commit.
    #[arg(long, default_value_t = 8)]
    committers: usize,
    #[arg(long, default_value_t = 5.0)]
    commit_seconds: f64,
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A connection to the coordinator of `group`, found through any bootstrap broker.
async fn coordinator(bootstrap: &[String], group: &str) -> anyhow::Result<Connection> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for addr in bootstrap {
            let Ok(mut c) = Connection::connect(addr).await else {
                continue;
            };
            let r = c
                .send(&FindCoordinatorRequest::default().with_key(s(group)), 3)
                .await?;
            if r.error_code == 0 {
                return Connection::connect(&format!("{}:{}", r.host, r.port))
                    .await
                    .context("connecting to the coordinator");
            }
        }
        if Instant::now() > deadline {
            bail!("no coordinator for group {group}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A member's news: (member index, generation it completed a sync in).
type Synced = (usize, i32);

struct MemberSpec {
    bootstrap: Vec<String>,
    index: usize,
    group: String,
    topic: String,
    partitions: i32,
    session_timeout_ms: i32,
    heartbeat: Duration,
}

/// A simulated member: joins, syncs (assigning round-robin when it leads), heartbeats, and
/// rejoins when told; stops (dies, without LeaveGroup) when `stop` turns true.
async fn member(
    spec: MemberSpec,
    mut conn: Connection,
    synced: mpsc::UnboundedSender<Synced>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let group = GroupId(s(&spec.group));
    let mut member_id = String::new();
    conn.set_client_id(format!("bench-member-{}", spec.index));
    'rejoin: loop {
        let join = JoinGroupRequest::default()
            .with_group_id(group.clone())
            .with_session_timeout_ms(spec.session_timeout_ms)
            .with_rebalance_timeout_ms(spec.session_timeout_ms * 4)
            .with_member_id(s(&member_id))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("roundrobin"))
                .with_metadata(Bytes::new())]);
        let r = tokio::select! {
            r = conn.send(&join, 5) => r?,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        match r.error_code {
            0 => {}
            79 => {
                member_id = r.member_id.to_string();
                continue;
            }
            25 => {
                member_id.clear();
                continue;
            }
            27 => continue,
            // The coordinator is loading or moved: as clients do, wait or find it again.
            14 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            15 | 16 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                conn = coordinator(&spec.bootstrap, &spec.group).await?;
                conn.set_client_id(format!("bench-member-{}", spec.index));
                continue;
            }
            code => bail!("member {}: JoinGroup error {code}", spec.index),
        }
        member_id = r.member_id.to_string();
        let generation = r.generation_id;
        let assignments = if r.leader.as_str() == member_id {
            let ids: Vec<String> = r.members.iter().map(|m| m.member_id.to_string()).collect();
            ids.iter()
                .enumerate()
                .map(|(i, id)| {
                    let mine: Vec<(String, i32)> = (0..spec.partitions)
                        .filter(|p| *p as usize % ids.len() == i)
                        .map(|p| (spec.topic.clone(), p))
                        .collect();
                    SyncGroupRequestAssignment::default()
                        .with_member_id(s(id))
                        .with_assignment(encode_assignment(&mine))
                })
                .collect()
        } else {
            Vec::new()
        };
        let sync = SyncGroupRequest::default()
            .with_group_id(group.clone())
            .with_generation_id(generation)
            .with_member_id(s(&member_id))
            .with_assignments(assignments);
        let r = tokio::select! {
            r = conn.send(&sync, 3) => r?,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        if r.error_code != 0 {
            continue;
        }
        let _ = synced.send((spec.index, generation));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(spec.heartbeat) => {}
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
            let hb = HeartbeatRequest::default()
                .with_group_id(group.clone())
                .with_generation_id(generation)
                .with_member_id(s(&member_id));
            match conn.send(&hb, 4).await?.error_code {
                0 => {}
                25 => {
                    member_id.clear();
                    continue 'rejoin;
                }
                _ => continue 'rejoin,
            }
        }
    }
}

struct Group {
    args: Arc<Args>,
    name: String,
    synced_tx: mpsc::UnboundedSender<Synced>,
    synced: mpsc::UnboundedReceiver<Synced>,
    /// Live members: (index, stop switch).
    live: Vec<(usize, watch::Sender<bool>)>,
    next: usize,
    generation: i32,
}

impl Group {
    async fn add(&mut self) -> anyhow::Result<()> {
        let index = self.next;
        self.next += 1;
        let conn = coordinator(&self.args.bootstrap, &self.name).await?;
        let (stop, stop_rx) = watch::channel(false);
        let spec = MemberSpec {
            bootstrap: self.args.bootstrap.clone(),
            index,
            group: self.name.clone(),
            topic: self.args.topic.clone(),
            partitions: self.args.partitions,
            session_timeout_ms: self.args.session_timeout_ms,
            heartbeat: Duration::from_millis(self.args.heartbeat_ms),
        };
        let tx = self.synced_tx.clone();
        tokio::spawn(async move {
            if let Err(e) = member(spec, conn, tx, stop_rx).await {
                eprintln!("member {index}: {e:#}");
            }
        });
        self.live.push((index, stop));
        Ok(())
    }

    /// Waits until every live member synced at one generation above the last settled one.
    async fn settle(&mut self, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        let mut at: std::collections::HashMap<usize, i32> = Default::default();
        loop {
            let all = self
                .live
                .iter()
                .all(|(i, _)| at.get(i).is_some_and(|g| *g > self.generation));
            let same: std::collections::HashSet<i32> = self
                .live
                .iter()
                .filter_map(|(i, _)| at.get(i).copied())
                .collect();
            if all && same.len() == 1 {
                self.generation = *same.iter().next().expect("one");
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, self.synced.recv()).await {
                Ok(Some((i, g))) => {
                    at.insert(i, g);
                }
                _ => bail!("group {} did not settle within {within:?}", self.name),
            }
        }
    }
}

async fn rebalances(
    args: Arc<Args>,
    size: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (synced_tx, synced) = mpsc::unbounded_channel();
    let mut g = Group {
        args: args.clone(),
        name: format!("bench-{size}-{}", std::process::id()),
        synced_tx,
        synced,
        live: Vec::new(),
        next: 0,
        generation: 0,
    };
    for _ in 0..size {
        g.add().await?;
    }
    g.settle(Duration::from_secs(60)).await?;
    let (mut joins, mut deaths) = (Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        let started = Instant::now();
        g.add().await?;
        g.settle(Duration::from_secs(60)).await?;
        joins.push(started.elapsed());
        // The oldest member dies: no LeaveGroup, its heartbeats just stop.
        let (_, stop) = g.live.remove(0);
        let started = Instant::now();
        stop.send_replace(true);
        g.settle(Duration::from_secs(60)).await?;
        deaths.push(started.elapsed());
    }
    for (_, stop) in &g.live {
        stop.send_replace(true);
    }
    Ok((joins, deaths))
}

async fn commits(args: Arc<Args>) -> anyhow::Result<(u64, Vec<Duration>, Duration)> {
    let mut tasks = Vec::new();
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(args.commit_seconds);
    for c in 0..args.committers {
        let args = args.clone();
        tasks.push(tokio::spawn(async move {
            let group = format!("bench-commit-{c}-{}", std::process::id());
            let mut conn = coordinator(&args.bootstrap, &group).await?;
            let mut latencies = Vec::new();
            let mut offset = 0i64;
            while Instant::now() < until {
                offset += 1;
                let req = OffsetCommitRequest::default()
                    .with_group_id(GroupId(s(&group)))
                    .with_generation_id_or_member_epoch(-1)
                    .with_member_id(s(""))
                    .with_retention_time_ms(-1)
                    .with_topics(vec![OffsetCommitRequestTopic::default()
                        .with_name(TopicName(s(&args.topic)))
                        .with_partitions(
                            (0..args.partitions)
                                .map(|p| {
                                    OffsetCommitRequestPartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(offset)
                                        .with_committed_leader_epoch(-1)
                                })
                                .collect(),
                        )]);
                let t = Instant::now();
                let r = conn.send(&req, 7).await?;
                latencies.push(t.elapsed());
                if let Some(code) = r
                    .topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .map(|p| p.error_code)
                    .find(|c| *c != 0)
                {
                    bail!("commit refused with error {code}");
                }
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed();
    all.sort();
    Ok((all.len() as u64, all, elapsed))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    anyhow::ensure!(!args.bootstrap.is_empty(), "give --bootstrap HOST:PORT");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for &size in &args.members {
        let (mut joins, mut deaths) = rebalances(args.clone(), size).await?;
        joins.sort();
        deaths.sort();
        println!(
            "group of {size}: rebalance on join p50 {:.0} ms p99 {:.0} ms; on death p50 {:.0} ms p99 {:.0} ms (session timeout {} ms, heartbeat {} ms, {} rounds)",
            ms(pct(&joins, 0.5)),
            ms(pct(&joins, 0.99)),
            ms(pct(&deaths, 0.5)),
            ms(pct(&deaths, 0.99)),
            args.session_timeout_ms,
            args.heartbeat_ms,
            args.rounds
        );
    }
    let (n, latencies, elapsed) = commits(args.clone()).await?;
    println!(
        "offset commits: {:.0} requests/s ({:.0} partition offsets/s) from {} committers; latency p50 {:.2} ms p99 {:.2} ms",
        n as f64 / elapsed.as_secs_f64(),
        n as f64 * f64::from(args.partitions) / elapsed.as_secs_f64(),
        args.committers,
        ms(pct(&latencies, 0.5)),
        ms(pct(&latencies, 0.99)),
    );
    Ok(())
}
