//! The records of `__consumer_offsets`, in Kafka's own formats so that Kafka tools can read
//! the topic: offset commits (key version 1, value version 3) and group metadata (key
//! version 2, value version 3), and the replay that rebuilds every group's committed
//! offsets and membership from them when a broker becomes a group's coordinator. A record
//! with a null value is a tombstone. Decoding never panics: damaged records are errors.

use std::collections::{BTreeMap, HashMap};

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Why a record of `__consumer_offsets` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record ends early (reading {0})")]
    Truncated(&'static str),
    #[error("unknown key version {0}")]
    KeyVersion(i16),
    #[error("unknown value version {0} for {1}")]
    ValueVersion(i16, &'static str),
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("negative length for {0}")]
    BadLength(&'static str),
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

/// A committed offset (OffsetCommitValue v3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

/// One member as stored in GroupMetadataValue v3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// A group's last completed generation (GroupMetadataValue v3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredGroup {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub state_timestamp: i64,
    pub members: Vec<StoredMember>,
}

/// The key of a record in `__consumer_offsets`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordKey {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    Group(String),
    /// A consumer-protocol (KIP-848) group's whole state (Strata's own record).
    ConsumerGroup(String),
}

impl RecordKey {
    pub fn group(&self) -> &str {
        match self {
            RecordKey::Offset { group, .. }
            | RecordKey::Group(group)
            | RecordKey::ConsumerGroup(group) => group,
        }
    }
}

const OFFSET_KEY_VERSION: i16 = 1;
const GROUP_KEY_VERSION: i16 = 2;
const OFFSET_VALUE_VERSION: i16 = 3;
const GROUP_VALUE_VERSION: i16 = 3;
/// Strata's own key version for a consumer-protocol group's state (Kafka's KIP-848 records
/// use 3 to 8 for the same state split over several records).
const CONSUMER_GROUP_KEY_VERSION: i16 = 1000;

pub(crate) fn put_str(buf: &mut BytesMut, s: &str) {
    buf.put_i16(s.len().min(i16::MAX as usize) as i16);
    buf.put_slice(&s.as_bytes()[..s.len().min(i16::MAX as usize)]);
}

fn put_opt_str(buf: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_str(buf, s),
        None => buf.put_i16(-1),
    }
}

fn put_bytes(buf: &mut BytesMut, b: &[u8]) {
    buf.put_i32(b.len() as i32);
    buf.put_slice(b);
}

fn need(buf: &Bytes, n: usize, what: &'static str) -> Result<(), RecordError> {
    if buf.remaining() < n {
        return Err(RecordError::Truncated(what));
    }
    Ok(())
}

pub(crate) fn get_i16(buf: &mut Bytes, what: &'static str) -> Result<i16, RecordError> {
    need(buf, 2, what)?;
    Ok(buf.get_i16())
}

pub(crate) fn get_i32(buf: &mut Bytes, what: &'static str) -> Result<i32, RecordError> {
    need(buf, 4, what)?;
    Ok(buf.get_i32())
}

pub(crate) fn get_i64(buf: &mut Bytes, what: &'static str) -> Result<i64, RecordError> {
    need(buf, 8, what)?;
    Ok(buf.get_i64())
}

fn get_opt_str(buf: &mut Bytes, what: &'static str) -> Result<Option<String>, RecordError> {
    let len = get_i16(buf, what)?;
    if len < 0 {
        return Ok(None);
    }
    need(buf, len as usize, what)?;
    let raw = buf.split_to(len as usize);
    String::from_utf8(raw.to_vec())
        .map(Some)
        .map_err(|_| RecordError::NotUtf8(what))
}

pub(crate) fn get_str(buf: &mut Bytes, what: &'static str) -> Result<String, RecordError> {
    get_opt_str(buf, what)?.ok_or(RecordError::BadLength(what))
}

fn get_bytes(buf: &mut Bytes, what: &'static str) -> Result<Bytes, RecordError> {
    let len = get_i32(buf, what)?;
    if len < 0 {
        return Ok(Bytes::new());
    }
    need(buf, len as usize, what)?;
    Ok(buf.split_to(len as usize))
}

pub(crate) fn done(buf: &Bytes) -> Result<(), RecordError> {
    match buf.remaining() {
        0 => Ok(()),
        n => Err(RecordError::Trailing(n)),
    }
}

impl RecordKey {
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::new();
        match self {
            RecordKey::Offset {
                group,
                topic,
                partition,
            } => {
                buf.put_i16(OFFSET_KEY_VERSION);
                put_str(&mut buf, group);
                put_str(&mut buf, topic);
                buf.put_i32(*partition);
            }
            RecordKey::Group(group) => {
                buf.put_i16(GROUP_KEY_VERSION);
                put_str(&mut buf, group);
            }
            RecordKey::ConsumerGroup(group) => {
                buf.put_i16(CONSUMER_GROUP_KEY_VERSION);
                put_str(&mut buf, group);
            }
        }
        buf.freeze()
    }

    /// Key versions 0 and 1 are offset commits, 2 is group metadata (as in Kafka).
    pub fn decode(mut buf: Bytes) -> Result<RecordKey, RecordError> {
        let key = match get_i16(&mut buf, "key version")? {
            0 | 1 => RecordKey::Offset {
                group: get_str(&mut buf, "group")?,
                topic: get_str(&mut buf, "topic")?,
                partition: get_i32(&mut buf, "partition")?,
            },
            2 => RecordKey::Group(get_str(&mut buf, "group")?),
            CONSUMER_GROUP_KEY_VERSION => RecordKey::ConsumerGroup(get_str(&mut buf, "group")?),
            v => return Err(RecordError::KeyVersion(v)),
        };
        done(&buf)?;
        Ok(key)
    }
}

impl CommittedOffset {
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::new();
        buf.put_i16(OFFSET_VALUE_VERSION);
        buf.put_i64(self.offset);
        buf.put_i32(self.leader_epoch);
        put_str(&mut buf, &self.metadata);
        buf.put_i64(self.commit_timestamp);
        buf.freeze()
    }

    /// Value versions 0-3 (1 adds an expiry, 3 a leader epoch; 2 drops the expiry).
    pub fn decode(mut buf: Bytes) -> Result<CommittedOffset, RecordError> {
        let version = get_i16(&mut buf, "offset value version")?;
        if !(0..=3).contains(&version) {
            return Err(RecordError::ValueVersion(version, "an offset commit"));
        }
        let offset = get_i64(&mut buf, "offset")?;
        let leader_epoch = if version >= 3 {
            get_i32(&mut buf, "leader epoch")?
        } else {
            -1
        };
        let metadata = get_str(&mut buf, "metadata")?;
        let commit_timestamp = get_i64(&mut buf, "commit timestamp")?;
        if version == 1 {
            get_i64(&mut buf, "expire timestamp")?;
        }
        done(&buf)?;
        Ok(CommittedOffset {
            offset,
            leader_epoch,
            metadata,
            commit_timestamp,
        })
    }
}

impl StoredGroup {
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::new();
        buf.put_i16(GROUP_VALUE_VERSION);
        put_str(&mut buf, &self.protocol_type);
        buf.put_i32(self.generation);
        put_opt_str(&mut buf, self.protocol.as_deref());
        put_opt_str(&mut buf, self.leader.as_deref());
        buf.put_i64(self.state_timestamp);
        buf.put_i32(self.members.len() as i32);
        for m in &self.members {
            put_str(&mut buf, &m.member_id);
            put_opt_str(&mut buf, m.instance_id.as_deref());
            put_str(&mut buf, &m.client_id);
            put_str(&mut buf, &m.client_host);
            buf.put_i32(m.rebalance_timeout_ms);
            buf.put_i32(m.session_timeout_ms);
            put_bytes(&mut buf, &m.subscription);
            put_bytes(&mut buf, &m.assignment);
        }
        buf.freeze()
    }

    /// Value versions 0-3 (1 adds the rebalance timeout, 2 the state timestamp, 3 the
    /// instance id).
    pub fn decode(mut buf: Bytes) -> Result<StoredGroup, RecordError> {
        let version = get_i16(&mut buf, "group value version")?;
        if !(0..=3).contains(&version) {
            return Err(RecordError::ValueVersion(version, "group metadata"));
        }
        let protocol_type = get_str(&mut buf, "protocol type")?;
        let generation = get_i32(&mut buf, "generation")?;
        let protocol = get_opt_str(&mut buf, "protocol")?;
        let leader = get_opt_str(&mut buf, "leader")?;
        let state_timestamp = if version >= 2 {
            get_i64(&mut buf, "state timestamp")?
        } else {
            -1
        };
        let count = get_i32(&mut buf, "member count")?;
        if count < 0 {
            return Err(RecordError::BadLength("members"));
        }
        // Each member takes at least 20 bytes: a count larger than the record is damage,
        // not an allocation to make.
        if count as usize > buf.remaining() / 20 + 1 {
            return Err(RecordError::Truncated("members"));
        }
        let mut members = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let member_id = get_str(&mut buf, "member id")?;
            let instance_id = if version >= 3 {
                get_opt_str(&mut buf, "instance id")?
            } else {
                None
            };
            let client_id = get_str(&mut buf, "client id")?;
            let client_host = get_str(&mut buf, "client host")?;
            let rebalance_timeout_ms = if version >= 1 {
                get_i32(&mut buf, "rebalance timeout")?
            } else {
                -1
            };
            let session_timeout_ms = get_i32(&mut buf, "session timeout")?;
            members.push(StoredMember {
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout_ms,
                session_timeout_ms,
                subscription: get_bytes(&mut buf, "subscription")?,
                assignment: get_bytes(&mut buf, "assignment")?,
            });
        }
        done(&buf)?;
        Ok(StoredGroup {
            protocol_type,
            generation,
            protocol,
            leader,
            state_timestamp,
            members,
        })
    }
}

/// Committed offsets: group -> (topic, partition) -> offset.
pub type Offsets = HashMap<String, BTreeMap<(String, i32), CommittedOffset>>;

/// The offsets one producer committed in its open transaction (TxnOffsetCommit): they
/// take effect when its commit marker is written, and are dropped with an abort.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PendingTxn {
    /// Where its first record is in the offsets partition (kept by snapshots).
    pub first_offset: i64,
    /// (group, topic, partition) -> offset.
    pub offsets: BTreeMap<(String, String, i32), CommittedOffset>,
}

impl PendingTxn {
    /// The transaction committed: its offsets become the groups' committed offsets.
    pub fn commit_into(self, offsets: &mut Offsets) {
        for ((group, topic, partition), o) in self.offsets {
            offsets
                .entry(group)
                .or_default()
                .insert((topic, partition), o);
        }
    }

    /// Whether it holds an offset of `group` for (topic, partition).
    pub fn holds(&self, group: &str, topic: &str, partition: i32) -> bool {
        self.offsets
            .contains_key(&(group.to_string(), topic.to_string(), partition))
    }
}

/// Every group's state rebuilt from a `__consumer_offsets` partition, record by record.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub offsets: Offsets,
    pub groups: HashMap<String, StoredGroup>,
    /// Consumer-protocol groups' latest state records (decoded when the coordinator loads).
    pub consumer_groups: HashMap<String, Bytes>,
    /// Transactional offset commits whose marker was not seen (yet), by producer id.
    pub pending: HashMap<i64, PendingTxn>,
    /// Records that could not be read, with their offsets (skipped, reported).
    pub damaged: Vec<(i64, RecordError)>,
}

impl Replayed {
    /// Applies one record of producer `producer_id`'s transaction at `offset`: held until
    /// its marker.
    pub fn apply_txn(&mut self, producer_id: i64, offset: i64, key: Bytes, value: Option<Bytes>) {
        let key = match RecordKey::decode(key) {
            Ok(k) => k,
            Err(e) => return self.damaged.push((offset, e)),
        };
        let (
            RecordKey::Offset {
                group,
                topic,
                partition,
            },
            Some(v),
        ) = (key, value)
        else {
            return self.damaged.push((
                offset,
                RecordError::BadLength("transactional offset commit"),
            ));
        };
        match CommittedOffset::decode(v) {
            Ok(c) => {
                let p = self
                    .pending
                    .entry(producer_id)
                    .or_insert_with(|| PendingTxn {
                        first_offset: offset,
                        ..PendingTxn::default()
                    });
                p.offsets.insert((group, topic, partition), c);
            }
            Err(e) => self.damaged.push((offset, e)),
        }
    }

    /// Producer `producer_id`'s marker: its pending offsets take effect, or go.
    pub fn end_txn(&mut self, producer_id: i64, commit: bool) {
        if let Some(p) = self.pending.remove(&producer_id) {
            if commit {
                p.commit_into(&mut self.offsets);
            }
        }
    }

    /// Applies one record (`value` `None`: a tombstone) at `offset`.
    pub fn apply(&mut self, offset: i64, key: Bytes, value: Option<Bytes>) {
        let key = match RecordKey::decode(key) {
            Ok(k) => k,
            Err(e) => return self.damaged.push((offset, e)),
        };
        match (key, value) {
            (
                RecordKey::Offset {
                    group,
                    topic,
                    partition,
                },
                None,
            ) => {
                if let Some(offsets) = self.offsets.get_mut(&group) {
                    offsets.remove(&(topic, partition));
                    if offsets.is_empty() {
                        self.offsets.remove(&group);
                    }
                }
            }
            (
                RecordKey::Offset {
                    group,
                    topic,
                    partition,
                },
                Some(v),
            ) => match CommittedOffset::decode(v) {
                Ok(c) => {
                    self.offsets
                        .entry(group)
                        .or_default()
                        .insert((topic, partition), c);
                }
                Err(e) => self.damaged.push((offset, e)),
            },
            (RecordKey::Group(group), None) => {
                self.groups.remove(&group);
                self.offsets.remove(&group);
            }
            (RecordKey::Group(group), Some(v)) => match StoredGroup::decode(v) {
                Ok(g) => {
                    self.groups.insert(group, g);
                }
                Err(e) => self.damaged.push((offset, e)),
            },
            (RecordKey::ConsumerGroup(group), None) => {
                self.consumer_groups.remove(&group);
            }
            (RecordKey::ConsumerGroup(group), Some(v)) => {
                self.consumer_groups.insert(group, v);
            }
        }
    }
}

/// The `__consumer_offsets` partition that holds group `group`: Kafka's
/// `abs(group.hashCode) % partitions`, with Java's String.hashCode, so a group lands
/// where Kafka would put it.
pub fn partition_for_group(group: &str, partitions: u32) -> u32 {
    let hash = group
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    // Kafka's Utils.abs: Integer.MIN_VALUE maps to 0.
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs as u32 % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn offset_key(g: &str, t: &str, p: i32) -> Bytes {
        RecordKey::Offset {
            group: g.into(),
            topic: t.into(),
            partition: p,
        }
        .encode()
    }

    fn committed(offset: i64) -> CommittedOffset {
        CommittedOffset {
            offset,
            leader_epoch: 4,
            metadata: "m".into(),
            commit_timestamp: 1_700_000_000_000,
        }
    }

    #[test]
    fn transactional_commits_wait_for_their_marker() {
        let mut r = Replayed::default();
        let v = |o| Some(committed(o).encode());
        r.apply(0, offset_key("g", "t", 0), v(5));
        r.apply_txn(7, 1, offset_key("g", "t", 0), v(9));
        r.apply_txn(8, 2, offset_key("g", "t", 1), v(3));
        r.apply_txn(7, 3, offset_key("g", "t", 2), v(4));
        assert_eq!(
            r.offsets["g"][&("t".to_string(), 0)].offset,
            5,
            "pending until the marker"
        );
        assert_eq!(r.pending[&7].first_offset, 1);
        assert!(r.pending[&7].holds("g", "t", 2) && !r.pending[&7].holds("g", "t", 1));
        r.end_txn(7, true);
        r.end_txn(8, false);
        let got: Vec<_> = r.offsets["g"]
            .iter()
            .map(|((_, p), o)| (*p, o.offset))
            .collect();
        assert_eq!(
            got,
            vec![(0, 9), (2, 4)],
            "7's commit applied, 8's abort dropped"
        );
        assert!(r.pending.is_empty());
        r.end_txn(9, true); // a marker with nothing pending changes nothing
        assert_eq!(r.offsets["g"].len(), 2);
    }

    fn group() -> StoredGroup {
        StoredGroup {
            protocol_type: "consumer".into(),
            generation: 7,
            protocol: Some("range".into()),
            leader: Some("a-1".into()),
            state_timestamp: 1_700_000_000_000,
            members: vec![StoredMember {
                member_id: "a-1".into(),
                instance_id: Some("host-a".into()),
                client_id: "a".into(),
                client_host: "/10.0.0.1".into(),
                rebalance_timeout_ms: 300_000,
                session_timeout_ms: 45_000,
                subscription: Bytes::from_static(b"sub"),
                assignment: Bytes::from_static(b"asg"),
            }],
        }
    }

    #[test]
    fn keys_and_values_round_trip_in_kafkas_layout() {
        let k = offset_key("settlement", "orders", 3);
        // version 1, then int16-length strings, then the partition
        assert_eq!(&k[..4], &[0, 1, 0, 10]);
        assert_eq!(&k[4..14], b"settlement");
        assert_eq!(&k[k.len() - 4..], &[0, 0, 0, 3]);
        assert_eq!(
            RecordKey::decode(k).unwrap(),
            RecordKey::Offset {
                group: "settlement".into(),
                topic: "orders".into(),
                partition: 3
            }
        );
        let v = committed(42).encode();
        assert_eq!(&v[..2], &[0, 3]);
        assert_eq!(CommittedOffset::decode(v).unwrap(), committed(42));
        let g = RecordKey::Group("settlement".into()).encode();
        assert_eq!(&g[..2], &[0, 2]);
        assert_eq!(StoredGroup::decode(group().encode()).unwrap(), group());
    }

    #[test]
    fn older_value_versions_are_read() {
        // v1 offset commit: offset, metadata, commit timestamp, expire timestamp
        let mut v = BytesMut::new();
        v.put_i16(1);
        v.put_i64(9);
        put_str(&mut v, "");
        v.put_i64(5);
        v.put_i64(6);
        let c = CommittedOffset::decode(v.freeze()).unwrap();
        assert_eq!((c.offset, c.leader_epoch, c.commit_timestamp), (9, -1, 5));
    }

    #[test]
    fn replay_keeps_the_latest_and_honours_tombstones() {
        let mut r = Replayed::default();
        r.apply(0, offset_key("g", "t", 0), Some(committed(10).encode()));
        r.apply(1, offset_key("g", "t", 1), Some(committed(20).encode()));
        r.apply(2, offset_key("g", "t", 0), Some(committed(11).encode()));
        r.apply(
            3,
            RecordKey::Group("g".into()).encode(),
            Some(group().encode()),
        );
        r.apply(4, offset_key("h", "t", 0), Some(committed(99).encode()));
        r.apply(5, offset_key("g", "t", 1), None);
        assert_eq!(r.offsets["g"][&("t".to_string(), 0)].offset, 11);
        assert!(!r.offsets["g"].contains_key(&("t".to_string(), 1)));
        assert_eq!(r.groups["g"].generation, 7);
        // deleting a group removes its membership and its offsets
        r.apply(6, RecordKey::Group("g".into()).encode(), None);
        assert!(!r.groups.contains_key("g") && !r.offsets.contains_key("g"));
        assert_eq!(r.offsets["h"][&("t".to_string(), 0)].offset, 99);
        assert!(r.damaged.is_empty());
    }

    #[test]
    fn damaged_records_are_reported_and_skipped() {
        let mut r = Replayed::default();
        let good = committed(1).encode();
        r.apply(0, Bytes::from_static(&[0, 9, 0, 0]), Some(good.clone()));
        r.apply(
            1,
            offset_key("g", "t", 0),
            Some(good.slice(..good.len() - 3)),
        );
        let mut bad_utf8 = BytesMut::new();
        bad_utf8.put_i16(2);
        bad_utf8.put_i16(2);
        bad_utf8.put_slice(&[0xff, 0xfe]);
        r.apply(2, bad_utf8.freeze(), None);
        let mut huge = BytesMut::from(&group().encode()[..]);
        huge.truncate(2 + 2 + 8 + 4 + 2 + 5 + 2 + 3 + 8);
        huge.put_i32(i32::MAX); // member count far beyond the record
        r.apply(
            3,
            RecordKey::Group("x".into()).encode(),
            Some(huge.freeze()),
        );
        let errors: Vec<_> = r.damaged.iter().map(|(o, _)| *o).collect();
        assert_eq!(errors, vec![0, 1, 2, 3]);
        assert_eq!(r.damaged[0].1, RecordError::KeyVersion(9));
        assert!(r.offsets.is_empty() && r.groups.is_empty());
    }

    #[test]
    fn groups_land_on_kafkas_partition() {
        // Java: "settlement".hashCode() == 73828649 -> % 50 == 49
        assert_eq!(partition_for_group("settlement", 50), 49);
        // Java: "".hashCode() == 0
        assert_eq!(partition_for_group("", 50), 0);
        // Java: "polygenelubricants".hashCode() == Integer.MIN_VALUE -> Utils.abs gives 0
        assert_eq!(partition_for_group("polygenelubricants", 50), 0);
        for g in ["a", "group-1", "reporting", "audit"] {
            assert!(partition_for_group(g, 50) < 50);
        }
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(key in proptest::collection::vec(any::<u8>(), 0..64),
                                                 value in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut r = Replayed::default();
            r.apply(0, Bytes::from(key.clone()), Some(Bytes::from(value.clone())));
            let _ = CommittedOffset::decode(Bytes::from(value.clone()));
            let _ = StoredGroup::decode(Bytes::from(value));
            let _ = RecordKey::decode(Bytes::from(key));
        }
    }
}
