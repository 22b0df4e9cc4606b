//! A deterministic simulation of replication: three brokers, the controllers' metadata state
//! machine and an idempotent acks=all producer, over a network that delays, drops and
//! reorders messages, with crashes (losing what was not fsynced), restarts (a few on an
//! empty disk), isolated brokers
//! and controller failovers between committing an AlterIsr and answering it. A quarter of the
//! runs have four brokers and play the laggard scenario (`laggard.rs`).
//!
//! Everything is driven by one seeded random generator, so a seed replays its run step for
//! step. After every step the invariants of docs/replication.md are checked; a failure prints
//! the seed and the run's trace.
//!
//! `cargo test -p strata-hot --test simulation` runs `SIM_SEEDS` seeds (default 2000) from
//! `SIM_FIRST_SEED` (default 0); `SIM_SEED=N` runs one seed and prints its whole trace.

mod manifest;
mod replica;
mod rng;
mod tier;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use strata_controller::metadata::{
    ClusterMetadata, Command, MetadataError, PartitionRecord, UNCLEAN_ELECTION_CONFIG,
};
use strata_hot::replication::leader::Assignment;
use uuid::Uuid;

use replica::{
    commit_ready, FetchError, Following, NotWritten, Phase, ProduceOutcome, Rec, Refusal, Replica,
    Role, COMMIT_PID,
};
use rng::Rng;

const TOPIC: &str = "settlements";
const PID: i64 = 1;
/// Steps per seed.
const STEPS: usize = 2_000;
/// Records the producer writes per seed.
const RECORDS: i32 = 100;
/// Batches an idempotent producer keeps in flight (Kafka's maximum with idempotence).
const IN_FLIGHT: usize = 5;
/// A broker silent this long is fenced by the controllers.
const LEASE_MS: i64 = 1_500;
/// A request unanswered this long is given up (and retried where the real code retries).
const REQUEST_TIMEOUT_MS: i64 = 2_000;
/// An acks=all produce waits this long for the HW.
const PRODUCE_TIMEOUT_MS: i64 = 3_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Producer,
    /// A consumer group's member, committing offsets to the group coordinator.
    Consumer,
    Controller,
    Broker(i32),
}

#[derive(Debug, Clone)]
enum Msg {
    Produce {
        req: u64,
        seq: i32,
    },
    ProduceReply {
        req: u64,
        seq: i32,
        result: Result<u64, &'static str>,
    },
    Fetch {
        req: u64,
        /// The sender's registration.
        broker_epoch: u64,
        epoch: i32,
        offset: u64,
    },
    FetchReply {
        req: u64,
        offset: u64,
        result: Result<(Vec<Rec>, u64), FetchError>,
    },
    EpochQuery {
        req: u64,
        epoch: i32,
        asked: i32,
    },
    EpochReply {
        req: u64,
        asked: i32,
        result: Result<Option<(i32, u64)>, FetchError>,
    },
    /// OffsetCommit: the group's next committed offset.
    Commit {
        req: u64,
        value: u64,
    },
    CommitReply {
        req: u64,
        value: u64,
        result: Result<(), &'static str>,
    },
    AlterIsr {
        req: u64,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: Vec<i32>,
        /// The members it adds, with the registrations that caught up.
        joining: Vec<(i32, u64)>,
        /// Set on the broker's retry after the controller it called failed over.
        retry: bool,
    },
    AlterIsrReply {
        req: u64,
        leader_epoch: i32,
        result: Result<(Vec<i32>, i32), Refusal>,
    },
}

struct Envelope {
    at: i64,
    /// Send order: messages between the same two nodes arrive in it (one connection).
    sent: u64,
    from: Node,
    to: Node,
    /// The incarnation of the broker at each end when sent (0 for other nodes).
    from_inc: u32,
    to_inc: u32,
    msg: Msg,
}

struct Producer {
    next_seq: i32,
    /// Sequence numbers written but not acknowledged, in order.
    unacked: BTreeSet<i32>,
    /// Requests in flight: seq -> (request id, sent at).
    in_flight: BTreeMap<i32, (u64, i64)>,
    /// Acknowledged: seq -> offset.
    acked: BTreeMap<i32, u64>,
}

/// A consumer group member committing offsets 1, 2, 3, ..., one at a time: the next only
/// once the last was acknowledged; an error or a timeout sends it again.
struct Consumer {
    next: u64,
    /// The request in flight and when it was sent.
    in_flight: Option<(u64, i64)>,
    /// The highest offset whose commit was acknowledged.
    acked: u64,
}

/// An AlterIsr request as the controller receives it.
struct AlterIsrCall {
    req: u64,
    leader_epoch: i32,
    partition_epoch: i32,
    isr: Vec<i32>,
    joining: Vec<(i32, u64)>,
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Deliver,
    Produce,
    Flush,
    Roll,
    Follower,
    IsrTick,
    Metadata,
    Lease,
    Crash,
    Restart,
    Isolate,
    Heal,
    Slow,
    Tier,
    StallMetadata,
    PowerLoss,
    Commit,
    Coordinator,
}

/// Counts across a run, to show the simulation exercised what it claims.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    acked: u64,
    elections: u64,
    truncations: u64,
    isr_changes: u64,
    lost_isr_answers: u64,
    crashes: u64,
    /// Restarts on an empty disk.
    disk_losses: u64,
    /// Laggards that rejoined the ISR, after which the rest of it failed (`laggard.rs`).
    laggard_rejoins: u64,
    /// Answers that reached a fetcher of an earlier role.
    stale_fetcher_answers: u64,
    /// Offset commits acknowledged.
    commits: u64,
}

struct World {
    rng: Rng,
    /// The brokers; each holds a replica of the partition.
    brokers: Vec<i32>,
    now: i64,
    meta: ClusterMetadata,
    index: u64,
    replicas: BTreeMap<i32, Replica>,
    /// Brokers cut off from everyone (alive, but no message gets through).
    isolated: BTreeSet<i32>,
    /// Leaders that will crash soon after their election (a flapping leader), and when.
    doomed: BTreeMap<i32, i64>,
    /// Brokers whose metadata watch is stuck until the given time (the controllers' view
    /// reaches them late).
    metadata_stalled: BTreeMap<i32, i64>,
    /// Brokers whose every message is slow until the given time (a gray failure: alive,
    /// heartbeating, but far behind).
    slow: BTreeMap<i32, i64>,
    /// Since when each broker has not heartbeated (crashed or isolated).
    silent_since: BTreeMap<i32, i64>,
    producer: Producer,
    consumer: Consumer,
    net: Vec<Envelope>,
    sent: u64,
    next_req: u64,
    trace: Option<Vec<String>>,
    stats: Stats,
    /// A seq acknowledged at two offsets (found when the second ack arrives).
    duplicate_ack: Option<(i32, u64, u64)>,
    /// The topic allows unclean leader election.
    unclean: bool,
    /// A liveness failure seen during the step.
    stuck: Option<String>,
    /// The cold tier: the partition's manifest and what its segments hold.
    tier: tier::ColdTier,
    /// The laggard scenario, in the runs that play it.
    laggard: Option<laggard::Laggard>,
}

macro_rules! trace {
    ($w:expr, $($arg:tt)*) => {
        if $w.trace.is_some() {
            let mut line = format!("{:>6}ms ", $w.now);
            let _ = write!(line, $($arg)*);
            if let Some(t) = $w.trace.as_mut() {
                t.push(line);
            }
        }
    };
}

mod laggard;

impl World {
    fn new(seed: u64, tracing: bool) -> Self {
        let mut rng = Rng::new(seed);
        let laggard = rng.chance(250).then(|| laggard::Laggard::new(&mut rng));
        let brokers: Vec<i32> = if laggard.is_some() {
            vec![1, 2, 3, 4]
        } else {
            vec![1, 2, 3]
        };
        let mut w = World {
            rng: Rng::new(0),
            now: 0,
            meta: ClusterMetadata::default(),
            index: 0,
            replicas: brokers.iter().map(|b| (*b, Replica::new(*b))).collect(),
            isolated: BTreeSet::new(),
            doomed: BTreeMap::new(),
            slow: BTreeMap::new(),
            metadata_stalled: BTreeMap::new(),
            silent_since: BTreeMap::new(),
            producer: Producer {
                next_seq: 0,
                unacked: BTreeSet::new(),
                in_flight: BTreeMap::new(),
                acked: BTreeMap::new(),
            },
            consumer: Consumer {
                next: 1,
                in_flight: None,
                acked: 0,
            },
            net: Vec::new(),
            sent: 0,
            next_req: 0,
            trace: tracing.then(Vec::new),
            stats: Stats::default(),
            duplicate_ack: None,
            unclean: false,
            stuck: None,
            tier: tier::ColdTier::default(),
            laggard,
            brokers,
        };
        for b in w.brokers.clone() {
            let incarnation = Uuid::from_u128(u128::from(rng.next_u64()));
            w.apply(Command::RegisterBroker {
                id: b,
                incarnation,
                endpoints: vec![],
                rack: None,
            })
            .expect("registration applies");
            let epoch = w.meta.brokers[&b].epoch;
            w.replicas.get_mut(&b).expect("broker").broker_epoch = epoch;
        }
        // Placement rotates the preferred leader: vary it by seed.
        for i in 0..rng.below(3) {
            w.apply(Command::CreateTopic {
                name: format!("other-{i}"),
                id: Uuid::from_u128(u128::from(rng.next_u64())),
                partitions: 1,
                replication_factor: 3,
                configs: BTreeMap::new(),
                assignments: vec![],
            })
            .expect("topic creation applies");
        }
        // A quarter of the runs let replicas outside the ISR be elected: acknowledged records
        // may then be lost (the topic chose availability), but replicas must still converge.
        // The laggard scenario checks that no acknowledged record is lost: not in those.
        w.unclean = rng.chance(250) && w.laggard.is_none();
        let mut configs = BTreeMap::new();
        if w.unclean {
            configs.insert(UNCLEAN_ELECTION_CONFIG.to_string(), "true".to_string());
        }
        w.apply(Command::CreateTopic {
            name: TOPIC.into(),
            id: Uuid::from_u128(u128::from(rng.next_u64())),
            partitions: 1,
            replication_factor: w.brokers.len() as u16,
            configs,
            assignments: vec![],
        })
        .expect("topic creation applies");
        w.rng = rng;
        let p = w.partition().clone();
        trace!(
            w,
            "created: replicas {:?}, leader {:?}, unclean election {}, laggard scenario {}",
            p.replicas,
            p.leader,
            w.unclean,
            w.laggard.is_some()
        );
        w
    }

    fn apply(&mut self, cmd: Command) -> Result<(), MetadataError> {
        self.index += 1;
        self.meta.apply(self.index, &cmd).map(|_| ())
    }

    fn partition(&self) -> &PartitionRecord {
        &self.meta.topics[TOPIC].partitions[0]
    }

    fn req(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    fn incarnation(&self, n: Node) -> u32 {
        match n {
            Node::Broker(b) => self.replicas[&b].incarnation,
            _ => 0,
        }
    }

    fn send(&mut self, from: Node, to: Node, msg: Msg) {
        if self.rng.chance(10) {
            trace!(self, "net drops {from:?}->{to:?} {msg:?}");
            return;
        }
        let mut delay = if self.rng.chance(50) {
            200 + self.rng.below(800) as i64
        } else {
            self.rng.below(30) as i64
        };
        let slow = |n: Node| matches!(n, Node::Broker(b) if self.slow.get(&b).is_some_and(|until| *until > self.now));
        if slow(from) || slow(to) {
            delay += 300 + self.rng.below(1_200) as i64;
        }
        let (from_inc, to_inc) = (self.incarnation(from), self.incarnation(to));
        self.sent += 1;
        self.net.push(Envelope {
            at: self.now + delay,
            sent: self.sent,
            from,
            to,
            from_inc,
            to_inc,
            msg,
        });
    }

    /// Whether a message between these ends can get through now.
    fn reachable(&self, e: &Envelope) -> bool {
        for (n, inc) in [(e.from, e.from_inc), (e.to, e.to_inc)] {
            if let Node::Broker(b) = n {
                let r = &self.replicas[&b];
                if !r.alive || r.incarnation != inc || self.isolated.contains(&b) {
                    return false;
                }
            }
        }
        true
    }

    fn step(&mut self) -> Result<(), String> {
        self.now += 1 + self.rng.below(20) as i64;
        let event = self.rng.weighted(&[
            (40, Event::Deliver),
            (10, Event::Produce),
            (10, Event::Flush),
            (4, Event::Roll),
            (12, Event::Follower),
            (6, Event::IsrTick),
            (6, Event::Metadata),
            (3, Event::Lease),
            (1, Event::Crash),
            (2, Event::Restart),
            (1, Event::Isolate),
            (2, Event::Heal),
            (1, Event::Slow),
            (3, Event::Tier),
            (1, Event::StallMetadata),
            (1, Event::PowerLoss),
            (3, Event::Commit),
            (4, Event::Coordinator),
        ]);
        let due: Vec<i32> = self
            .doomed
            .iter()
            .filter(|(_, at)| **at <= self.now)
            .map(|(b, _)| *b)
            .collect();
        for b in due {
            self.doomed.remove(&b);
            if self.replicas[&b].alive {
                self.crash(b);
            }
        }
        self.laggard_step();
        let mut b = self.brokers[self.rng.below(self.brokers.len() as u64) as usize];
        if matches!(event, Event::Crash | Event::Isolate | Event::Slow) && self.rng.chance(500) {
            // Faults hit the leader more often than chance would: that is where they hurt.
            if let Some(l) = self.partition().leader {
                b = l;
            }
        }
        match event {
            Event::Deliver => self.deliver(),
            Event::Produce => self.producer_act(),
            Event::Commit => self.consumer_act(),
            Event::Coordinator => {
                // a broker with commits queued (a closed coordinator's among them)
                let busy: Vec<i32> = self
                    .replicas
                    .values()
                    .filter(|r| {
                        r.alive && r.coordinators.values().any(|q| commit_ready(q, self.now))
                    })
                    .map(|r| r.id)
                    .collect();
                if !busy.is_empty() {
                    let b = busy[self.rng.below(busy.len() as u64) as usize];
                    self.coordinator_act(b);
                }
            }
            Event::Flush => {
                if self.replicas[&b].alive {
                    let r = self.replicas.get_mut(&b).expect("broker");
                    let before = r.published;
                    if let Some(end) = r.flush() {
                        if end > before {
                            trace!(self, "b{b} publishes durable end {end}");
                        }
                    }
                }
            }
            Event::Roll => {
                if self.replicas[&b].alive && self.replicas.get_mut(&b).expect("broker").roll() {
                    trace!(self, "b{b} rolls a segment at {}", self.replicas[&b].end());
                }
            }
            Event::Follower => self.follower_act(b),
            Event::IsrTick => self.isr_tick(b),
            Event::Metadata => self.deliver_metadata(b),
            Event::Lease => self.check_leases(),
            Event::Crash => {
                // Runs with unclean election crash more: the elections they then make are
                // where replica histories fork.
                let odds = if self.unclean { 600 } else { 200 };
                if self.replicas[&b].alive && self.rng.chance(odds) && !self.laggard_playing() {
                    self.crash(b);
                    // Now and then its disk is lost too, and it is started again at once on
                    // a new one, while the leader still remembers its last fetches.
                    if self.disk_loss_survivable(b) && self.rng.chance(150) {
                        self.lose_disk(b);
                        self.restart(b);
                    }
                }
            }
            Event::Restart => {
                if !self.replicas[&b].alive && !self.laggard_held_down(b) {
                    // or its disk was replaced while it was down
                    if self.disk_loss_survivable(b) && self.rng.chance(100) {
                        self.lose_disk(b);
                    }
                    self.restart(b);
                }
            }
            Event::Isolate => {
                if self.replicas[&b].alive
                    && self.isolated.is_empty()
                    && self.rng.chance(200)
                    && !self.laggard_playing()
                {
                    self.isolated.insert(b);
                    self.silent_since.entry(b).or_insert(self.now);
                    trace!(self, "b{b} ISOLATED");
                }
            }
            Event::Tier => {
                let r = &self.replicas[&b];
                if let Some(line) = self.tier.act(r, &mut self.rng) {
                    trace!(self, "b{b} {line}");
                }
            }
            Event::PowerLoss => {
                // Every broker loses power at once (a rack or a zone): each keeps only what
                // it fsynced, and whatever was counted as durable had better be.
                if self.rng.chance(40) && !self.laggard_playing() {
                    trace!(self, "POWER LOSS");
                    for b in self.brokers.clone() {
                        if self.replicas[&b].alive {
                            self.crash(b);
                        }
                    }
                }
            }
            Event::StallMetadata => {
                if self.rng.chance(300) {
                    let until = self.now + 500 + self.rng.below(3_500) as i64;
                    self.metadata_stalled.insert(b, until);
                    trace!(self, "b{b} metadata STALLED until {until}ms");
                }
            }
            Event::Slow => {
                if self.rng.chance(300) {
                    let until = self.now + 1_000 + self.rng.below(4_000) as i64;
                    self.slow.insert(b, until);
                    trace!(self, "b{b} SLOW until {until}ms");
                }
            }
            Event::Heal => {
                if self.isolated.remove(&b) {
                    self.silent_since.remove(&b);
                    let epoch = self.meta.brokers[&b].epoch;
                    if self.meta.brokers[&b].fenced {
                        let _ = self.apply(Command::UnfenceBroker { id: b, epoch });
                    }
                    trace!(self, "b{b} HEALED: {:?}", self.partition());
                }
            }
        }
        self.resolve_waiters();
        self.check_invariants()
    }

    /// Whether `b` losing its disk now can lose nothing acknowledged: another ISR member has
    /// it. Not in a run with unclean elections, nor when `b` is the ISR's last member (the
    /// controllers keep that one, so it could come back and lead with nothing, as in Kafka).
    /// The check is made as the broker starts on the new disk: its registration then takes it
    /// out of the ISR before anything else happens.
    fn disk_loss_survivable(&self, b: i32) -> bool {
        !self.unclean && !self.laggard_playing() && self.partition().isr != [b]
    }

    fn lose_disk(&mut self, b: i32) {
        self.replicas.get_mut(&b).expect("broker").lose_disk();
        self.stats.disk_losses += 1;
        trace!(self, "b{b} LOSES ITS DISK");
    }

    /// The process starts again and registers with a new incarnation.
    fn restart(&mut self, b: i32) {
        self.replicas.get_mut(&b).expect("broker").restart();
        let incarnation = Uuid::from_u128(u128::from(self.rng.next_u64()));
        let _ = self.apply(Command::RegisterBroker {
            id: b,
            incarnation,
            endpoints: vec![],
            rack: None,
        });
        let epoch = self.meta.brokers[&b].epoch;
        self.replicas.get_mut(&b).expect("broker").broker_epoch = epoch;
        self.silent_since.remove(&b);
        let r = &self.replicas[&b];
        trace!(
            self,
            "b{b} RESTARTS with log end {} epochs {:?}; registered: {:?}",
            r.end(),
            r.epochs.entries(),
            self.partition()
        );
    }

    fn crash(&mut self, b: i32) {
        self.stats.crashes += 1;
        let r = self.replicas.get_mut(&b).expect("broker");
        let before = r.end();
        r.crash(&mut self.rng);
        let (kept, durable) = (r.end(), r.durable);
        self.silent_since.entry(b).or_insert(self.now);
        trace!(
            self,
            "b{b} CRASHES: log {before} -> {kept} (fsynced {durable})"
        );
    }

    fn deliver(&mut self) {
        // Any due message that is the oldest on its connection: connections are reordered
        // against each other, never within.
        let due: Vec<usize> = (0..self.net.len())
            .filter(|i| {
                let e = &self.net[*i];
                e.at <= self.now
                    && !self
                        .net
                        .iter()
                        .any(|o| o.from == e.from && o.to == e.to && o.sent < e.sent)
            })
            .collect();
        if due.is_empty() {
            return;
        }
        let i = due[self.rng.below(due.len() as u64) as usize];
        let e = self.net.swap_remove(i);
        if !self.reachable(&e) {
            return;
        }
        match (e.to, e.msg) {
            (Node::Broker(b), Msg::Produce { req, seq }) => {
                let now = self.now;
                let r = self.replicas.get_mut(&b).expect("broker");
                match r.produce(req, PID, seq, now) {
                    ProduceOutcome::Wait(w) => {
                        trace!(
                            self,
                            "b{b} appends seq {seq} at {} (epoch {})",
                            w.base,
                            w.epoch
                        );
                        self.replicas.get_mut(&b).expect("broker").waiters.push(w);
                    }
                    ProduceOutcome::Refused(why) => {
                        trace!(self, "b{b} refuses seq {seq}: {why}");
                        self.send(
                            Node::Broker(b),
                            Node::Producer,
                            Msg::ProduceReply {
                                req,
                                seq,
                                result: Err(why),
                            },
                        );
                    }
                }
            }
            (Node::Broker(b), Msg::Commit { req, value }) => {
                let now = self.now;
                let r = self.replicas.get_mut(&b).expect("broker");
                match r.accept_commit(req, value, &mut self.rng, now) {
                    Ok(epoch) => {
                        trace!(
                            self,
                            "b{b}'s coordinator of epoch {epoch} queues commit {value}"
                        )
                    }
                    Err(why) => self.refuse_commit(b, req, value, why),
                }
            }
            (Node::Consumer, Msg::CommitReply { req, value, result }) => {
                self.on_commit_reply(req, value, result)
            }
            (Node::Producer, Msg::ProduceReply { req, seq, result }) => {
                self.on_produce_reply(req, seq, result)
            }
            (
                Node::Broker(b),
                Msg::Fetch {
                    req,
                    broker_epoch,
                    epoch,
                    offset,
                },
            ) => {
                let Node::Broker(from) = e.from else { return };
                let now = self.now;
                let result = self.replicas.get_mut(&b).expect("broker").serve_fetch(
                    from,
                    broker_epoch,
                    epoch,
                    offset,
                    now,
                );
                self.send(
                    Node::Broker(b),
                    e.from,
                    Msg::FetchReply {
                        req,
                        offset,
                        result,
                    },
                );
            }
            (
                Node::Broker(b),
                Msg::FetchReply {
                    req,
                    offset,
                    result,
                },
            ) => self.on_fetch_reply(b, req, offset, result),
            (Node::Broker(b), Msg::EpochQuery { req, epoch, asked }) => {
                let result = self.replicas[&b].serve_epoch_query(epoch, asked);
                self.send(
                    Node::Broker(b),
                    e.from,
                    Msg::EpochReply { req, asked, result },
                );
            }
            (Node::Broker(b), Msg::EpochReply { req, asked, result }) => {
                self.on_epoch_reply(b, req, asked, result)
            }
            (
                Node::Controller,
                Msg::AlterIsr {
                    req,
                    leader_epoch,
                    partition_epoch,
                    isr,
                    joining,
                    retry,
                },
            ) => {
                let Node::Broker(b) = e.from else { return };
                let call = AlterIsrCall {
                    req,
                    leader_epoch,
                    partition_epoch,
                    isr,
                    joining,
                };
                self.controller_alter_isr(b, call, retry)
            }
            (
                Node::Broker(b),
                Msg::AlterIsrReply {
                    req,
                    leader_epoch,
                    result,
                },
            ) => {
                let now = self.now;
                let r = self.replicas.get_mut(&b).expect("broker");
                let Role::Leader { call, .. } = &r.role else {
                    return;
                };
                if call.as_ref().is_none_or(|c| c.req != req) {
                    return;
                }
                trace!(self, "b{b} AlterIsr answer: {result:?}");
                self.replicas
                    .get_mut(&b)
                    .expect("broker")
                    .isr_answer(leader_epoch, result, now);
            }
            (to, msg) => panic!("misrouted message to {to:?}: {msg:?}"),
        }
    }

    /// The active controller handles AlterIsr: the command is committed to the metadata log
    /// and answered, unless this controller dies between the two (then the broker's client
    /// retries on another controller, which finds the change already applied).
    fn controller_alter_isr(&mut self, b: i32, call: AlterIsrCall, retry: bool) {
        let AlterIsrCall {
            req,
            leader_epoch,
            partition_epoch,
            isr,
            joining,
        } = call;
        let before = self.partition().isr.clone();
        let result = if self.meta.brokers[&b].fenced {
            Err(Refusal::Unknown)
        } else {
            match self.apply(Command::AlterIsr {
                topic: TOPIC.into(),
                partition: 0,
                leader: b,
                leader_epoch,
                partition_epoch,
                isr: isr.clone(),
                joining: joining.clone(),
            }) {
                Ok(()) => {
                    self.stats.isr_changes += 1;
                    let p = self.partition();
                    Ok((p.isr.clone(), p.partition_epoch))
                }
                Err(MetadataError::InvalidIsr { .. }) => Err(Refusal::Invalid),
                Err(_) => Err(Refusal::Unknown),
            }
        };
        trace!(self, "controller AlterIsr from b{b} {isr:?} (joining {joining:?}) at partition epoch {partition_epoch}: {result:?}");
        if result.is_ok() {
            self.laggard_on_isr_change(&before);
        }
        if result.is_ok() && !retry && self.rng.chance(150) {
            self.stats.lost_isr_answers += 1;
            trace!(self, "controller FAILS OVER before answering b{b}");
            self.send(
                Node::Broker(b),
                Node::Controller,
                Msg::AlterIsr {
                    req,
                    leader_epoch,
                    partition_epoch,
                    isr,
                    joining,
                    retry: true,
                },
            );
            return;
        }
        self.send(
            Node::Controller,
            Node::Broker(b),
            Msg::AlterIsrReply {
                req,
                leader_epoch,
                result,
            },
        );
    }

    fn producer_act(&mut self) {
        let Some(leader) = self.partition().leader else {
            return;
        };
        let now = self.now;
        // A request unanswered too long: the client gives up on all in flight and resends.
        if self
            .producer
            .in_flight
            .values()
            .any(|(_, at)| now - at > PRODUCE_TIMEOUT_MS + 500)
        {
            self.producer.in_flight.clear();
        }
        if self.producer.unacked.len() < IN_FLIGHT && self.producer.next_seq < RECORDS {
            let seq = self.producer.next_seq;
            self.producer.next_seq += 1;
            self.producer.unacked.insert(seq);
        }
        let to_send: Vec<i32> = self
            .producer
            .unacked
            .iter()
            .copied()
            .filter(|s| !self.producer.in_flight.contains_key(s))
            .collect();
        for seq in to_send {
            let req = self.req();
            self.producer.in_flight.insert(seq, (req, now));
            self.send(
                Node::Producer,
                Node::Broker(leader),
                Msg::Produce { req, seq },
            );
        }
    }

    fn consumer_act(&mut self) {
        let Some(leader) = self.partition().leader else {
            return;
        };
        if self
            .consumer
            .in_flight
            .is_some_and(|(_, at)| self.now - at <= PRODUCE_TIMEOUT_MS + 500)
        {
            return;
        }
        let req = self.req();
        let value = self.consumer.next;
        self.consumer.in_flight = Some((req, self.now));
        self.send(
            Node::Consumer,
            Node::Broker(leader),
            Msg::Commit { req, value },
        );
    }

    fn on_commit_reply(&mut self, req: u64, value: u64, result: Result<(), &'static str>) {
        if self.consumer.in_flight.is_none_or(|(r, _)| r != req) {
            return;
        }
        self.consumer.in_flight = None;
        match result {
            Ok(()) => {
                trace!(self, "consumer: offset {value} COMMITTED");
                self.stats.commits += 1;
                self.consumer.acked = self.consumer.acked.max(value);
                self.consumer.next = value + 1;
            }
            Err(why) => trace!(self, "consumer: commit of {value} failed ({why})"),
        }
    }

    fn refuse_commit(&mut self, b: i32, req: u64, value: u64, why: &'static str) {
        let result = Err(why);
        let msg = Msg::CommitReply { req, value, result };
        self.send(Node::Broker(b), Node::Consumer, msg);
    }

    /// A group coordinator on `b` handles its next queued commit.
    fn coordinator_act(&mut self, b: i32) {
        let now = self.now;
        let r = self.replicas.get_mut(&b).expect("broker");
        if !r.alive {
            return;
        }
        let Some((req, value, epoch, outcome)) = r.coordinator_step(&mut self.rng, now) else {
            return;
        };
        match outcome {
            Ok(w) => {
                let current = r.leader_epoch();
                trace!(
                    self,
                    "b{b}'s coordinator of epoch {epoch} appends commit {value} at {} (leading at {current:?})",
                    w.base
                );
                self.replicas.get_mut(&b).expect("broker").waiters.push(w);
            }
            Err(why) => {
                trace!(
                    self,
                    "b{b}'s coordinator of epoch {epoch} refuses commit {value}: {why}"
                );
                self.refuse_commit(b, req, value, why);
            }
        }
    }

    fn on_produce_reply(&mut self, req: u64, seq: i32, result: Result<u64, &'static str>) {
        match result {
            Ok(offset) => {
                if let Some(prev) = self.producer.acked.insert(seq, offset) {
                    if prev != offset {
                        // Reported by the invariant check (a record written twice).
                        self.producer.acked.insert(seq, prev);
                        trace!(
                            self,
                            "producer: seq {seq} acknowledged again at {offset}, first at {prev}"
                        );
                        self.duplicate_ack = Some((seq, prev, offset));
                        return;
                    }
                }
                self.stats.acked += 1;
                trace!(self, "producer: seq {seq} ACKED at {offset}");
                self.laggard_on_ack(offset);
                self.producer.unacked.remove(&seq);
                self.producer.in_flight.remove(&seq);
            }
            Err(why) => {
                if self
                    .producer
                    .in_flight
                    .get(&seq)
                    .is_some_and(|(r, _)| *r == req)
                {
                    trace!(
                        self,
                        "producer: seq {seq} failed ({why}); resending all unacknowledged"
                    );
                    self.producer.in_flight.clear();
                }
            }
        }
    }

    fn resolve_waiters(&mut self) {
        let now = self.now;
        let mut replies = Vec::new();
        for r in self.replicas.values_mut() {
            let (epoch, under_min) = match &r.role {
                Role::Leader { epoch, state, .. } => (Some(*epoch), state.under_min_isr()),
                _ => (None, false),
            };
            let hw = r.hw;
            r.waiters.retain(|w| {
                let result = if epoch != Some(w.epoch) {
                    Err("NOT_LEADER_OR_FOLLOWER")
                } else if hw >= w.end && under_min {
                    Err("NOT_ENOUGH_REPLICAS_AFTER_APPEND")
                } else if hw >= w.end {
                    Ok(w.base)
                } else if now - w.since > PRODUCE_TIMEOUT_MS {
                    Err("REQUEST_TIMED_OUT")
                } else {
                    return true;
                };
                replies.push((r.id, w.req, w.seq, w.commit, result));
                false
            });
        }
        for (b, req, seq, commit, result) in replies {
            let (to, msg) = if commit {
                let (value, result) = (seq as u64, result.map(|_| ()));
                (Node::Consumer, Msg::CommitReply { req, value, result })
            } else {
                (Node::Producer, Msg::ProduceReply { req, seq, result })
            };
            self.send(Node::Broker(b), to, msg);
        }
    }

    /// The fetcher task of a follower: one request at a time, resent after a timeout.
    fn follower_act(&mut self, b: i32) {
        let now = self.now;
        let req = self.req();
        let r = self.replicas.get_mut(&b).expect("broker");
        if !r.alive {
            return;
        }
        let end = r.end();
        let durable = r.published;
        let broker_epoch = r.broker_epoch;
        let latest = r.epochs.latest().map(|e| e.epoch);
        let Role::Follower {
            leader,
            epoch,
            phase,
            awaiting,
            asked,
            ..
        } = &mut r.role
        else {
            return;
        };
        if awaiting.is_some_and(|(_, at)| now - at < REQUEST_TIMEOUT_MS) {
            return;
        }
        let (leader, epoch) = (*leader, *epoch);
        let msg = match *phase {
            Phase::Truncating => match latest {
                None => {
                    *phase = Phase::Fetching;
                    *awaiting = None;
                    return;
                }
                Some(latest) => {
                    *asked = latest;
                    Msg::EpochQuery {
                        req,
                        epoch,
                        asked: latest,
                    }
                }
            },
            Phase::Fetching => {
                // Fetch only from what is fsynced here: the fetch offset is what the leader
                // counts as this replica's log end.
                if durable < end {
                    return;
                }
                Msg::Fetch {
                    req,
                    broker_epoch,
                    epoch,
                    offset: end,
                }
            }
        };
        *awaiting = Some((req, now));
        self.send(Node::Broker(b), Node::Broker(leader), msg);
    }

    /// The fetcher of `b` waiting for the answer `req`, and whether it is the current one
    /// (else a fetcher of an earlier role whose task has not noticed yet); clears the wait.
    fn take_awaited(&mut self, b: i32, req: u64) -> Option<(Following, bool)> {
        let r = self.replicas.get_mut(&b).expect("broker");
        if let Role::Follower {
            leader,
            epoch,
            awaiting,
            ..
        } = &mut r.role
        {
            if awaiting.is_some_and(|(q, _)| q == req) {
                *awaiting = None;
                let at = Following {
                    leader: *leader,
                    epoch: *epoch,
                };
                return Some((at, true));
            }
        }
        let i = r.stale_fetchers.iter().position(|(q, _)| *q == req)?;
        self.stats.stale_fetcher_answers += 1;
        Some((r.stale_fetchers.swap_remove(i).1, false))
    }

    fn set_phase(&mut self, b: i32, to: Phase) {
        if let Role::Follower { phase, .. } = &mut self.replicas.get_mut(&b).expect("broker").role {
            *phase = to;
        }
    }

    fn on_epoch_reply(
        &mut self,
        b: i32,
        req: u64,
        asked: i32,
        result: Result<Option<(i32, u64)>, FetchError>,
    ) {
        let Some((at, current)) = self.take_awaited(b, req) else {
            return;
        };
        let Ok(answer) = result else {
            return; // refused: ask again
        };
        let r = self.replicas.get_mut(&b).expect("broker");
        let before = r.end();
        let Some(again) = r.on_epoch_answer(at, answer) else {
            trace!(
                self,
                "b{b}'s fetcher of {at:?} got its epoch answer after the role changed: no cut"
            );
            return;
        };
        let after = r.end();
        if after < before {
            self.stats.truncations += 1;
        }
        trace!(
            self,
            "b{b} asked epoch {asked}, leader answered {answer:?}: log {before} -> {after}{}{}",
            if again { ", asking again" } else { "" },
            if current {
                ""
            } else {
                " (a fetcher of an earlier role)"
            }
        );
        if !current {
            return; // that fetcher's task ends here
        }
        if !again {
            self.set_phase(b, Phase::Fetching);
        }
        if let Role::Follower { rounds, .. } = &mut self.replicas.get_mut(&b).expect("broker").role
        {
            *rounds = if again { *rounds + 1 } else { 0 };
            if *rounds > 32 {
                self.stuck = Some(format!(
                    "b{b} asked the leader again {rounds} times in a row: truncation does not end"
                ));
            }
        }
    }

    fn on_fetch_reply(
        &mut self,
        b: i32,
        req: u64,
        offset: u64,
        result: Result<(Vec<Rec>, u64), FetchError>,
    ) {
        let Some((at, current)) = self.take_awaited(b, req) else {
            return;
        };
        let r = self.replicas.get_mut(&b).expect("broker");
        match result {
            Ok((recs, hw)) => {
                match r.append_replicated(at, offset, &recs) {
                    Ok(()) => {}
                    Err(NotWritten::NotFollowing) => {
                        trace!(
                            self,
                            "b{b}'s fetcher of {at:?} got {} records at {offset} after the role changed: not written",
                            recs.len()
                        );
                        return;
                    }
                    Err(NotWritten::Gap) => {
                        if current {
                            self.set_phase(b, Phase::Truncating);
                        }
                        return;
                    }
                }
                r.set_follower_hw(at, hw);
                if !recs.is_empty() || !current {
                    trace!(
                        self,
                        "b{b} replicated {} records at {offset}, hw {hw}{}",
                        recs.len(),
                        if current {
                            ""
                        } else {
                            " (a fetcher of an earlier role)"
                        }
                    );
                }
            }
            Err(FetchError::OutOfRange { leader_end }) if offset > leader_end => {
                // Past the leader's end: cut there, then truncate by epochs again.
                if r.cut_as(at, leader_end).is_none() {
                    return;
                }
                trace!(
                    self,
                    "b{b} fetch at {offset} is past the leader's end {leader_end}: cut there"
                );
                if current {
                    self.set_phase(b, Phase::Truncating);
                }
            }
            Err(e) => {
                trace!(self, "b{b} fetch at {offset} refused: {e:?}");
                if current {
                    self.set_phase(b, Phase::Truncating);
                }
            }
        }
    }

    fn isr_tick(&mut self, b: i32) {
        let now = self.now;
        let r = self.replicas.get_mut(&b).expect("broker");
        if !r.alive {
            return;
        }
        // A call unanswered past its deadline fails (the client's retries ran out).
        if let Role::Leader {
            epoch,
            call: Some(c),
            ..
        } = &r.role
        {
            if now - c.sent_at > REQUEST_TIMEOUT_MS {
                let epoch = *epoch;
                r.isr_answer(epoch, Err(Refusal::Unknown), now);
                trace!(self, "b{b} AlterIsr call timed out");
            }
            return;
        }
        let Some((epoch, partition_epoch, isr, joining)) = r.isr_tick(now) else {
            return;
        };
        let req = self.req();
        if let Role::Leader { call, .. } = &mut self.replicas.get_mut(&b).expect("broker").role {
            *call = Some(replica::IsrCall {
                req,
                proposed_at: partition_epoch,
                sent_at: now,
            });
        }
        trace!(
            self,
            "b{b} proposes ISR {isr:?} at partition epoch {partition_epoch}"
        );
        self.send(
            Node::Broker(b),
            Node::Controller,
            Msg::AlterIsr {
                req,
                leader_epoch: epoch,
                partition_epoch,
                isr,
                joining,
                retry: false,
            },
        );
    }

    /// The broker's metadata watch catches up with the controllers (`broker/reconcile.rs`).
    fn deliver_metadata(&mut self, b: i32) {
        if !self.replicas[&b].alive
            || self.isolated.contains(&b)
            || self
                .metadata_stalled
                .get(&b)
                .is_some_and(|until| *until > self.now)
        {
            return;
        }
        let p = self.partition().clone();
        let now = self.now;
        let r = self.replicas.get_mut(&b).expect("broker");
        match p.leader {
            Some(l) if l == b => {
                let was = r.leader_epoch();
                r.become_leader(
                    p.leader_epoch,
                    Assignment {
                        me: b,
                        replicas: p.replicas.clone(),
                        isr: p.isr.clone(),
                        partition_epoch: p.partition_epoch,
                    },
                    now,
                );
                if was != Some(p.leader_epoch) {
                    self.stats.elections += 1;
                    if self.rng.chance(100) && !self.laggard_playing() {
                        let at = self.now + self.rng.below(1_500) as i64;
                        self.doomed.insert(b, at);
                    }
                    let r = &self.replicas[&b];
                    trace!(
                        self,
                        "b{b} LEADS epoch {} (ISR {:?}, log end {}, hw {}, epochs {:?})",
                        p.leader_epoch,
                        p.isr,
                        r.end(),
                        r.hw,
                        r.epochs.entries()
                    );
                }
            }
            Some(l) => {
                if r.become_follower(l, p.leader_epoch) {
                    trace!(
                        self,
                        "b{b} follows b{l} at epoch {} (log end {}, epochs {:?})",
                        p.leader_epoch,
                        r.end(),
                        r.epochs.entries()
                    );
                }
            }
            None => r.become_idle(),
        }
    }

    /// The controllers fence brokers whose lease expired (crashed or cut off).
    fn check_leases(&mut self) {
        let expired: Vec<i32> = self
            .silent_since
            .iter()
            .filter(|(b, since)| self.now - **since > LEASE_MS && !self.meta.brokers[b].fenced)
            .map(|(b, _)| *b)
            .collect();
        for b in expired {
            let epoch = self.meta.brokers[&b].epoch;
            let _ = self.apply(Command::FenceBroker { id: b, epoch });
            trace!(self, "controller FENCES b{b}: {:?}", self.partition());
        }
    }

    /// The leader the controllers elected, once it acts on it.
    fn acting_leader(&self) -> Option<&Replica> {
        let p = self.partition();
        let r = &self.replicas[&p.leader?];
        (r.alive && r.leader_epoch() == Some(p.leader_epoch)).then_some(r)
    }

    fn check_invariants(&mut self) -> Result<(), String> {
        if let Some(e) = self.stuck.take() {
            return Err(e);
        }
        // 5. A follower done truncating agrees with its leader below both HWs, with or
        //    without unclean elections.
        for f in self.replicas.values().filter(|r| r.alive) {
            let Role::Follower {
                leader,
                epoch,
                phase: Phase::Fetching,
                ..
            } = f.role
            else {
                continue;
            };
            let l = &self.replicas[&leader];
            if !l.alive || l.leader_epoch() != Some(epoch) {
                continue;
            }
            let k = f.hw.min(l.hw) as usize;
            if let Some(o) = (0..k).find(|o| f.log[*o] != l.log[*o]) {
                return Err(format!(
                    "b{} follows b{} at epoch {epoch} but disagrees with it at offset {o}, below both HWs ({} and {}): {:?} vs {:?}",
                    f.id, l.id, f.hw, l.hw, f.log[o], l.log[o]
                ));
            }
        }
        // 8. No broker trusts a torn record when it opens its log.
        if let Some(e) = self.replicas.values().find_map(|r| r.corrupt.clone()) {
            return Err(e);
        }
        // 7. No broker publishes a durable end past what it fsynced: a follower reports its
        //    log end only once durable, and a leader counts itself up to it.
        if let Some(r) = self
            .replicas
            .values()
            .find(|r| r.alive && r.published > r.durable as u64)
        {
            return Err(format!(
                "b{} published durable end {} past its fsynced prefix {} (log end {})",
                r.id,
                r.published,
                r.durable,
                r.end()
            ));
        }
        // 6. The cold tier is a prefix of the elected leader's log once it claimed the
        //    manifest (with or without unclean elections).
        if let Some(l) = self.acting_leader() {
            self.tier.check_prefix_of(l)?;
        }
        for r in self.replicas.values_mut() {
            // 2. The HW never moves back on a leader.
            if let Role::Leader { max_hw, .. } = &mut r.role {
                if r.hw < *max_hw {
                    return Err(format!(
                        "leader b{} moved its HW back from {} to {}",
                        r.id, max_hw, r.hw
                    ));
                }
                *max_hw = r.hw;
            }
        }
        if self.unclean {
            // An unclean election may lose acknowledged records and producer state.
            self.duplicate_ack = None;
            return Ok(());
        }
        if let Some((seq, first, again)) = self.duplicate_ack.take() {
            return Err(format!(
                "idempotent retry written twice: seq {seq} acknowledged at {first} and again at {again}"
            ));
        }
        // 9. The group's committed offset never goes back: the last commit in the elected
        //    leader's log is at least the highest one acknowledged.
        if let Some(l) = self.acting_leader() {
            let acked = self.consumer.acked;
            let last = l.log.iter().rev().find(|r| r.pid == COMMIT_PID);
            if acked > 0 && last.is_none_or(|r| (r.seq as u64) < acked) {
                return Err(format!(
                    "the group's committed offset went back: leader b{} holds {:?} last, and {acked} was acknowledged",
                    l.id,
                    last.map(|r| r.seq)
                ));
            }
        }
        // 1. No acknowledged record is missing from the elected leader.
        if let Some(l) = self.acting_leader() {
            for (seq, offset) in &self.producer.acked {
                let found = l.log.get(*offset as usize);
                if found.is_none_or(|r| r.pid != PID || r.seq != *seq) {
                    return Err(format!(
                        "acknowledged seq {seq} at offset {offset} is missing from leader b{} (found {found:?}, log end {})",
                        l.id,
                        l.end()
                    ));
                }
            }
        }
        for r in self.replicas.values() {
            // 3. No record is written twice below the HW.
            let mut seen = [None; RECORDS as usize];
            for (o, rec) in r.log.iter().take(r.hw as usize).enumerate() {
                if rec.pid != PID {
                    continue;
                }
                if let Some(first) = seen[rec.seq as usize].replace(o) {
                    return Err(format!(
                        "b{} holds seq {} twice below its HW {}: at {first} and {o}",
                        r.id, rec.seq, r.hw
                    ));
                }
            }
        }
        // 4. Replicas agree below their high watermarks.
        let alive: Vec<&Replica> = self.replicas.values().filter(|r| r.alive).collect();
        for (i, a) in alive.iter().enumerate() {
            for b in &alive[i + 1..] {
                let k = a.hw.min(b.hw) as usize;
                if a.log[..k] == b.log[..k] {
                    continue;
                }
                if let Some(o) = (0..k).find(|o| a.log[*o] != b.log[*o]) {
                    return Err(format!(
                        "b{} and b{} disagree at offset {o}, below both HWs ({} and {}): {:?} vs {:?}",
                        a.id, b.id, a.hw, b.hw, a.log[o], b.log[o]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Runs one seed: what it exercised or the broken invariant, and the trace (when tracing).
fn run(seed: u64, tracing: bool) -> (Result<Stats, String>, Vec<String>) {
    let mut w = World::new(seed, tracing);
    for _ in 0..STEPS {
        if let Err(e) = w.step() {
            return (Err(e), w.trace.take().unwrap_or_default());
        }
    }
    (Ok(w.stats), w.trace.take().unwrap_or_default())
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")),
    )
}

/// Runs the seeds the environment asks for: one, traced (`SIM_SEED`), or `SIM_SEEDS` from
/// `SIM_FIRST_SEED`, each passing run's figures handed to `add`; a failure is replayed from
/// its seed, its trace's tail printed, and the test fails. Returns how many seeds ran (0 for
/// one traced seed, which checks nothing more).
fn sweep<T: std::fmt::Debug>(
    test: &str,
    run: impl Fn(u64, bool) -> (Result<T, String>, Vec<String>),
    mut add: impl FnMut(T),
) -> u64 {
    if let Some(seed) = env_u64("SIM_SEED") {
        let (result, trace) = run(seed, true);
        for line in &trace {
            println!("{line}");
        }
        match result {
            Ok(figures) => println!("{test}: seed {seed} passed: {figures:?}"),
            Err(e) => panic!("{test}: seed {seed} failed: {e}"),
        }
        return 0;
    }
    let seeds = env_u64("SIM_SEEDS").unwrap_or(5_000);
    let first = env_u64("SIM_FIRST_SEED").unwrap_or(0);
    for seed in first..first + seeds {
        match run(seed, false).0 {
            Ok(figures) => add(figures),
            Err(e) => {
                let (again, trace) = run(seed, true);
                assert_eq!(again.err().as_ref(), Some(&e), "a seed replays its failure");
                let tail = trace.len().saturating_sub(80);
                for line in &trace[tail..] {
                    println!("{line}");
                }
                panic!(
                    "{test}: seed {seed} failed: {e}\n(last {} of {} trace lines above; replay it with SIM_SEED={seed} cargo test -p strata-hot --test simulation {test} -- --nocapture)",
                    trace.len() - tail,
                    trace.len()
                );
            }
        }
    }
    println!("{test}: {seeds} seeds from {first}");
    seeds
}

#[test]
fn replication_survives_seeded_faults() {
    let mut total = Stats::default();
    let seeds = sweep("replication_survives_seeded_faults", run, |s: Stats| {
        total.acked += s.acked;
        total.elections += s.elections;
        total.truncations += s.truncations;
        total.isr_changes += s.isr_changes;
        total.lost_isr_answers += s.lost_isr_answers;
        total.crashes += s.crashes;
        total.disk_losses += s.disk_losses;
        total.laggard_rejoins += s.laggard_rejoins;
        total.stale_fetcher_answers += s.stale_fetcher_answers;
        total.commits += s.commits;
    });
    if seeds == 0 {
        return;
    }
    println!("{total:?}");
    // The run must have exercised what it claims to.
    assert!(
        total.acked > seeds * (RECORDS as u64) / 20,
        "too few acks: {total:?}"
    );
    assert!(total.elections > seeds, "too few elections: {total:?}");
    assert!(
        total.truncations > 0
            && total.lost_isr_answers > 0
            && total.crashes > 0
            && total.disk_losses > 0
            && total.laggard_rejoins > 0
            && total.stale_fetcher_answers > 0
            && total.commits > seeds / 8,
        "{total:?}"
    );
}

#[test]
fn manifest_writers_survive_seeded_interleavings() {
    let mut acks = 0;
    let seeds = sweep(
        "manifest_writers_survive_seeded_interleavings",
        |seed, _| manifest::run(seed),
        |n| acks += n,
    );
    if seeds == 0 {
        return;
    }
    println!("{acks} acknowledged manifest updates");
    assert!(acks > seeds * 10, "too few acknowledged updates: {acks}");
}
