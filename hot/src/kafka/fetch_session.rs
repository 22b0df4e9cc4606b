//! Fetch sessions (KIP-227): a consumer of many partitions names them once, then sends only
//! what changed, and hears back only about partitions that changed.
//!
//! A Fetch (v7+) carries a session id and an epoch:
//! - id 0, epoch -1: no session; every partition asked is answered (what v4-v6 always do);
//! - id 0, epoch 0: a full request that opens a session: every partition is answered, and
//!   the response carries the new session's id (0 when the cache has no room, and the client
//!   goes on with full requests);
//! - id N, epoch 0 or -1: session N is closed; the request is full, and epoch 0 opens a new
//!   session;
//! - id N, epoch E > 0: incremental. The request's partitions are added to the session or
//!   update its entries (fetch offset, byte budget, leader epoch), `forgotten_topics_data`
//!   leaves it, and every partition of the session is read; the response holds those with
//!   records, an error, or a high watermark, last stable offset or log start that moved since
//!   the session last answered them. An unknown session is FETCH_SESSION_ID_NOT_FOUND, an
//!   epoch other than the one expected INVALID_FETCH_SESSION_EPOCH; the client then opens a
//!   new session with a full request.
//!
//! Partitions that returned records move to the end of their session's order, so that under
//! the response's byte budget (only the first partition may exceed it, KIP-74) every
//! partition gets its turn, as in Kafka.
//!
//! The cache is bounded by sessions (`kafka.fetch_session_cache_slots`, Kafka's
//! `max.incremental.fetch.session.cache.slots`) and by the partitions all sessions hold
//! (`kafka.fetch_session_cache_partitions`). When it is full, a session idle for at least
//! `EVICTABLE_AFTER` (Kafka's `min.incremental.fetch.session.eviction.ms`) makes room, the
//! least recently used first; otherwise the new session is not made. A session belongs to
//! the principal that opened it: another principal naming its id is told it does not exist.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::TopicName;

use super::codes;
use super::limits::ListenerStats;

pub const INVALID_SESSION_ID: i32 = 0;
pub const INITIAL_EPOCH: i32 = 0;
pub const FINAL_EPOCH: i32 = -1;

/// How long a session must be unused before a new one may take its place.
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(120);

/// A partition's place in a session: a topic and a partition index.
pub type Key = (TopicName, i32);

/// What a request (or a session) asks of one partition.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub topic: TopicName,
    pub partition: i32,
    pub fetch_offset: i64,
    pub max_bytes: i32,
    pub current_leader_epoch: i32,
}

impl Wanted {
    fn key(&self) -> Key {
        (self.topic.clone(), self.partition)
    }
}

/// What a session last told the client of a partition.
#[derive(Debug, Clone)]
struct Cached {
    wanted: Wanted,
    high_watermark: i64,
    last_stable: i64,
    log_start: i64,
}

struct Session {
    principal: String,
    /// The epoch the next incremental request must carry.
    epoch: i32,
    /// The order partitions are read and answered in.
    order: Vec<Key>,
    parts: HashMap<Key, Cached>,
    last_used: Instant,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<i32, Session>,
    /// Partitions over all sessions.
    partitions: usize,
}

/// The broker's fetch sessions, shared by its Kafka listeners.
pub struct Cache {
    slots: usize,
    max_partitions: usize,
    inner: Mutex<Inner>,
    /// Where /metrics reads the counts.
    stats: Arc<ListenerStats>,
}

/// How one fetch request is served.
#[derive(Debug)]
pub enum Plan {
    /// Read the partitions asked, answer all of them; no session.
    Sessionless(Vec<Wanted>),
    /// Read the partitions asked, answer all of them, then open a session holding them.
    Full(Vec<Wanted>),
    /// Read every partition of session `id` (in its order), answer the changed ones.
    Incremental { id: i32, partitions: Vec<Wanted> },
    /// Answer this top-level error and nothing else.
    Refused(i16),
}

impl Plan {
    pub fn partitions(&self) -> &[Wanted] {
        match self {
            Plan::Sessionless(p) | Plan::Full(p) | Plan::Incremental { partitions: p, .. } => p,
            Plan::Refused(_) => &[],
        }
    }
}

/// The epoch after `epoch`: 1 follows the largest (0 and -1 have meanings of their own).
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl Cache {
    pub fn new(slots: usize, max_partitions: usize, stats: Arc<ListenerStats>) -> Cache {
        Cache {
            slots,
            max_partitions,
            inner: Mutex::new(Inner::default()),
            stats,
        }
    }

    /// Publishes the session and partition counts.
    fn publish(&self, inner: &Inner) {
        self.stats
            .fetch_sessions
            .store(inner.sessions.len() as u64, Relaxed);
        self.stats
            .fetch_session_partitions
            .store(inner.partitions as u64, Relaxed);
    }

    /// Sessions open now.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .expect("fetch session cache poisoned")
            .sessions
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides how a request is served, applying an incremental request's changes to its
    /// session. `asked` is the request's partitions, each once, in request order.
    pub fn plan(
        &self,
        principal: &str,
        session_id: i32,
        epoch: i32,
        asked: Vec<Wanted>,
        forgotten: Vec<Key>,
    ) -> Plan {
        let full = epoch == INITIAL_EPOCH || epoch == FINAL_EPOCH;
        let mut inner = self.inner.lock().expect("fetch session cache poisoned");
        if full {
            if session_id != INVALID_SESSION_ID {
                // Any session a full request names is closed, whoever asks: the id is
                // the client's to give up.
                inner.remove(session_id, principal);
                self.publish(&inner);
            }
            return if epoch == FINAL_EPOCH {
                Plan::Sessionless(asked)
            } else {
                Plan::Full(asked)
            };
        }
        let max_partitions = self.max_partitions;
        let inner = &mut *inner;
        let Some(session) = inner
            .sessions
            .get_mut(&session_id)
            .filter(|s| s.principal == principal)
        else {
            return Plan::Refused(codes::FETCH_SESSION_ID_NOT_FOUND);
        };
        if session.epoch != epoch {
            return Plan::Refused(codes::INVALID_FETCH_SESSION_EPOCH);
        }
        for key in forgotten {
            if session.parts.remove(&key).is_some() {
                session.order.retain(|k| *k != key);
                inner.partitions -= 1;
            }
        }
        let added = asked
            .iter()
            .filter(|w| !session.parts.contains_key(&w.key()))
            .count();
        if inner.partitions + added > max_partitions {
            // The session would outgrow the cache: closed, so the client starts again
            // with a full request (answered without a session if that does not fit either).
            inner.remove(session_id, principal);
            self.publish(inner);
            return Plan::Refused(codes::FETCH_SESSION_ID_NOT_FOUND);
        }
        for w in asked {
            let key = w.key();
            match session.parts.get_mut(&key) {
                Some(c) => c.wanted = w,
                None => {
                    session.order.push(key.clone());
                    session.parts.insert(
                        key,
                        Cached {
                            wanted: w,
                            high_watermark: -1,
                            last_stable: -1,
                            log_start: -1,
                        },
                    );
                }
            }
        }
        inner.partitions += added;
        session.epoch = next_epoch(epoch);
        session.last_used = Instant::now();
        let partitions = session
            .order
            .iter()
            .map(|k| session.parts[k].wanted.clone())
            .collect();
        self.publish(inner);
        self.stats.fetch_incremental.fetch_add(1, Relaxed);
        Plan::Incremental {
            id: session_id,
            partitions,
        }
    }

    /// Opens a session holding `asked`, what `responses` told the client of each. Returns
    /// its id, or `INVALID_SESSION_ID` when the cache has no room.
    pub fn open(
        &self,
        principal: &str,
        asked: &[Wanted],
        responses: &[FetchableTopicResponse],
    ) -> i32 {
        let mut inner = self.inner.lock().expect("fetch session cache poisoned");
        if asked.len() > self.max_partitions {
            self.stats.fetch_sessions_refused.fetch_add(1, Relaxed);
            return INVALID_SESSION_ID;
        }
        while inner.sessions.len() >= self.slots
            || inner.partitions + asked.len() > self.max_partitions
        {
            let idle = inner
                .sessions
                .iter()
                .filter(|(_, s)| s.last_used.elapsed() >= EVICTABLE_AFTER)
                .min_by_key(|(_, s)| s.last_used)
                .map(|(id, _)| *id);
            let Some(id) = idle else {
                self.stats.fetch_sessions_refused.fetch_add(1, Relaxed);
                self.publish(&inner);
                return INVALID_SESSION_ID;
            };
            let s = inner.sessions.remove(&id).expect("just found");
            inner.partitions -= s.parts.len();
            self.stats.fetch_sessions_evicted.fetch_add(1, Relaxed);
        }
        let id = loop {
            let mut b = [0u8; 4];
            getrandom::fill(&mut b).expect("the operating system's random source works");
            let id = (u32::from_le_bytes(b) >> 1) as i32;
            if id != INVALID_SESSION_ID && !inner.sessions.contains_key(&id) {
                break id;
            }
        };
        let mut session = Session {
            principal: principal.to_string(),
            epoch: next_epoch(INITIAL_EPOCH),
            order: asked.iter().map(Wanted::key).collect(),
            parts: asked
                .iter()
                .map(|w| {
                    let cached = Cached {
                        wanted: w.clone(),
                        high_watermark: -1,
                        last_stable: -1,
                        log_start: -1,
                    };
                    (w.key(), cached)
                })
                .collect(),
            last_used: Instant::now(),
        };
        for (key, p) in answered(responses) {
            if let Some(c) = session.parts.get_mut(&key) {
                c.remember(p);
            }
        }
        inner.partitions += session.parts.len();
        inner.sessions.insert(id, session);
        self.publish(&inner);
        id
    }

    /// Keeps, of a read of every partition of session `id`, the partitions the client must
    /// hear about, and remembers what it was told. Partitions that returned records move to
    /// the end of the session's order. A session gone meanwhile (closed or evicted) keeps
    /// them all; the client's next request finds it gone.
    pub fn changed(
        &self,
        id: i32,
        responses: Vec<FetchableTopicResponse>,
    ) -> Vec<FetchableTopicResponse> {
        let mut inner = self.inner.lock().expect("fetch session cache poisoned");
        let Some(session) = inner.sessions.get_mut(&id) else {
            return responses;
        };
        let mut moved = Vec::new();
        let kept = responses
            .into_iter()
            .filter_map(|mut t| {
                t.partitions.retain(|p| {
                    let key = (t.topic.clone(), p.partition_index);
                    let Some(c) = session.parts.get_mut(&key) else {
                        return true;
                    };
                    let has_records = p.records.as_ref().is_some_and(|r| !r.is_empty());
                    let must = has_records
                        || p.error_code != codes::NONE
                        || p.preferred_read_replica.0 >= 0
                        || c.high_watermark != p.high_watermark
                        || c.last_stable != p.last_stable_offset
                        || c.log_start != p.log_start_offset;
                    c.remember(p);
                    if has_records {
                        moved.push(key);
                    }
                    must
                });
                (!t.partitions.is_empty()).then_some(t)
            })
            .collect();
        if !moved.is_empty() {
            let moved_set: std::collections::HashSet<&Key> = moved.iter().collect();
            let mut order: Vec<Key> = session
                .order
                .iter()
                .filter(|k| !moved_set.contains(k))
                .cloned()
                .collect();
            order.extend(moved.iter().cloned());
            session.order = order;
        }
        session.last_used = Instant::now();
        kept
    }
}

impl Inner {
    fn remove(&mut self, id: i32, principal: &str) {
        if self
            .sessions
            .get(&id)
            .is_some_and(|s| s.principal == principal)
        {
            let s = self.sessions.remove(&id).expect("just found");
            self.partitions -= s.parts.len();
        }
    }
}

impl Cached {
    fn remember(&mut self, p: &PartitionData) {
        self.high_watermark = p.high_watermark;
        self.last_stable = p.last_stable_offset;
        self.log_start = p.log_start_offset;
    }
}

/// Every partition of `responses` with its topic.
fn answered(responses: &[FetchableTopicResponse]) -> impl Iterator<Item = (Key, &PartitionData)> {
    responses.iter().flat_map(|t| {
        t.partitions
            .iter()
            .map(move |p| ((t.topic.clone(), p.partition_index), p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use kafka_protocol::protocol::StrBytes;

    fn topic(name: &str) -> TopicName {
        TopicName(StrBytes::from_string(name.to_string()))
    }

    fn want(t: &str, p: i32, offset: i64) -> Wanted {
        Wanted {
            topic: topic(t),
            partition: p,
            fetch_offset: offset,
            max_bytes: 1 << 20,
            current_leader_epoch: -1,
        }
    }

    /// A response: (topic, partition, high watermark, records).
    fn response(parts: &[(&str, i32, i64, &'static [u8])]) -> Vec<FetchableTopicResponse> {
        parts
            .iter()
            .map(|(t, p, hw, records)| {
                FetchableTopicResponse::default()
                    .with_topic(topic(t))
                    .with_partitions(vec![PartitionData::default()
                        .with_partition_index(*p)
                        .with_high_watermark(*hw)
                        .with_last_stable_offset(*hw)
                        .with_records(Some(Bytes::from_static(records)))])
            })
            .collect()
    }

    fn names(responses: &[FetchableTopicResponse]) -> Vec<(String, i32)> {
        answered(responses)
            .map(|((t, p), _)| (t.0.to_string(), p))
            .collect()
    }

    fn order(plan: &Plan) -> Vec<(String, i32, i64)> {
        plan.partitions()
            .iter()
            .map(|w| (w.topic.0.to_string(), w.partition, w.fetch_offset))
            .collect()
    }

    #[test]
    fn an_incremental_request_reads_the_whole_session_and_answers_only_what_changed() {
        let cache = Cache::new(10, 100, Arc::default());
        let asked = vec![want("a", 0, 0), want("a", 1, 0), want("b", 0, 0)];
        let Plan::Full(asked) = cache.plan("User:c", 0, INITIAL_EPOCH, asked, vec![]) else {
            panic!("a full request")
        };
        let id = cache.open(
            "User:c",
            &asked,
            &response(&[("a", 0, 5, b""), ("a", 1, 0, b""), ("b", 0, 0, b"")]),
        );
        assert_ne!(id, INVALID_SESSION_ID);

        // nothing asked: all three read, none changed
        let plan = cache.plan("User:c", id, 1, vec![], vec![]);
        assert_eq!(
            order(&plan),
            vec![("a".into(), 0, 0), ("a".into(), 1, 0), ("b".into(), 0, 0)]
        );
        let kept = cache.changed(
            id,
            response(&[("a", 0, 5, b""), ("a", 1, 0, b""), ("b", 0, 0, b"")]),
        );
        assert!(kept.is_empty(), "{:?}", names(&kept));

        // a's partition 0 moves on: only it, and its new offset is kept
        let plan = cache.plan("User:c", id, 2, vec![want("a", 0, 5)], vec![]);
        assert_eq!(order(&plan)[0], ("a".into(), 0, 5));
        let kept = cache.changed(
            id,
            response(&[("a", 0, 9, b"xyz"), ("a", 1, 0, b""), ("b", 0, 3, b"")]),
        );
        assert_eq!(names(&kept), vec![("a".into(), 0), ("b".into(), 0)]);
        // a-0 returned records: it goes last
        let plan = cache.plan("User:c", id, 3, vec![], vec![(topic("b"), 0)]);
        assert_eq!(
            order(&plan),
            vec![("a".into(), 1, 0), ("a".into(), 0, 5)],
            "b-0 forgotten, a-0 moved behind a-1"
        );
    }

    #[test]
    fn wrong_epochs_unknown_ids_and_other_principals_are_refused() {
        let cache = Cache::new(10, 100, Arc::default());
        let id = cache.open("User:c", &[want("a", 0, 0)], &[]);
        assert!(matches!(
            cache.plan("User:c", id, 2, vec![], vec![]),
            Plan::Refused(codes::INVALID_FETCH_SESSION_EPOCH)
        ));
        assert!(matches!(
            cache.plan("User:mallory", id, 1, vec![], vec![]),
            Plan::Refused(codes::FETCH_SESSION_ID_NOT_FOUND)
        ));
        assert!(matches!(
            cache.plan("User:c", id + 1, 1, vec![], vec![]),
            Plan::Refused(codes::FETCH_SESSION_ID_NOT_FOUND)
        ));
        // id 0 with a positive epoch names no session
        assert!(matches!(
            cache.plan("User:c", 0, 1, vec![], vec![]),
            Plan::Refused(codes::FETCH_SESSION_ID_NOT_FOUND)
        ));
        // the right epoch still works after refusals, and the next one after it
        assert!(matches!(
            cache.plan("User:c", id, 1, vec![], vec![]),
            Plan::Incremental { .. }
        ));
        assert!(matches!(
            cache.plan("User:c", id, 1, vec![], vec![]),
            Plan::Refused(codes::INVALID_FETCH_SESSION_EPOCH)
        ));
        // a full request naming the session closes it; epoch -1 opens none
        assert!(matches!(
            cache.plan("User:c", id, FINAL_EPOCH, vec![], vec![]),
            Plan::Sessionless(_)
        ));
        assert!(cache.is_empty());
    }

    #[test]
    fn the_cache_keeps_to_its_slots_and_partitions_and_evicts_only_idle_sessions() {
        let stats = Arc::new(ListenerStats::default());
        let cache = Cache::new(2, 5, stats.clone());
        let a = cache.open("User:c", &[want("a", 0, 0), want("a", 1, 0)], &[]);
        let b = cache.open("User:c", &[want("b", 0, 0)], &[]);
        assert!(a != 0 && b != 0);
        // no slot, none idle long enough: no session
        assert_eq!(cache.open("User:c", &[want("c", 0, 0)], &[]), 0);
        assert_eq!(stats.fetch_sessions_refused.load(Relaxed), 1);
        // more partitions than the cache holds: no session
        let many: Vec<Wanted> = (0..6).map(|p| want("d", p, 0)).collect();
        assert_eq!(cache.open("User:c", &many, &[]), 0);

        // an incremental request that would outgrow the cache closes its session
        let grow: Vec<Wanted> = (0..3).map(|p| want("e", p, 0)).collect();
        assert!(matches!(
            cache.plan("User:c", a, 1, grow, vec![]),
            Plan::Refused(codes::FETCH_SESSION_ID_NOT_FOUND)
        ));
        assert_eq!(cache.len(), 1);
        // and the room it held is free again
        let c = cache.open("User:c", &[want("c", 0, 0), want("c", 1, 0)], &[]);
        assert_ne!(c, 0);

        // idle sessions make room, the least recently used first
        {
            let mut inner = cache.inner.lock().unwrap();
            let long_ago = Instant::now() - EVICTABLE_AFTER - Duration::from_secs(5);
            inner.sessions.get_mut(&b).unwrap().last_used = long_ago;
            inner.sessions.get_mut(&c).unwrap().last_used = long_ago + Duration::from_secs(1);
        }
        let d = cache.open("User:c", &[want("d", 0, 0)], &[]);
        assert_ne!(d, 0);
        assert_eq!(stats.fetch_sessions_evicted.load(Relaxed), 1);
        assert_eq!(stats.fetch_sessions.load(Relaxed), 2);
        assert_eq!(stats.fetch_session_partitions.load(Relaxed), 3);
        assert!(matches!(
            cache.plan("User:c", b, 1, vec![], vec![]),
            Plan::Refused(codes::FETCH_SESSION_ID_NOT_FOUND)
        ));
        assert!(matches!(
            cache.plan("User:c", c, 1, vec![], vec![]),
            Plan::Incremental { .. }
        ));
    }

    #[test]
    fn epochs_wrap_past_the_largest_to_one() {
        assert_eq!(next_epoch(1), 2);
        assert_eq!(next_epoch(i32::MAX), 1);
    }
}
