//! What one client may take from a broker's Kafka listeners, with Kafka's names:
//! `max.connections`, `max.connections.per.ip` (and its overrides) and
//! `queued.max.request.bytes`; and the file descriptors the sockets may take.
//!
//! Request memory, fair to every client: a request frame's buffer grows as its bytes arrive
//! (in steps of at most 1 MiB), and every byte read takes its share of a budget first; the
//! share is held until the request's response has been written. There are three budgets:
//! - `queued.max.request.bytes`, the pool, for frames of authenticated connections (every
//!   connection of a listener without SASL);
//! - a sixteenth of that (at least 1 MiB), for frames read before SASL authentication, so
//!   that connections which never log in cannot take the pool from those that did;
//! - each connection's own floor of [`FLOOR_BYTES`]: a frame of at most that size that finds
//!   its budget used up is read on the connection's floor instead of waiting. So however many
//!   stalled or flooding connections fill the pool, every other client's small requests
//!   (a login, Metadata, a produce of a few records) are still read and answered; a
//!   connection can hold back only itself.
//!
//! Large frames wait while their budget is in use (in arrival order). While an
//! authenticated one waits, a frame of the pool that has received nothing for [`STALLED`]
//! is closed, which returns its share: a stalled frame keeps its memory only as long as no
//! client needs it.
//! Any frame that stalls half-sent is closed after `kafka.frame_timeout`. The request memory
//! a broker holds is therefore at most the pool, plus the pre-authentication budget, plus
//! `FLOOR_BYTES` per open connection.
//!
//! File descriptors: at start the process's limit (RLIMIT_NOFILE) is raised to its hard
//! maximum. Every second the open descriptors are counted; client connections may take
//! what the rest of the process does not use, less a reserve (an eighth of the limit, at
//! least 64) kept for the log engine (segment rolls, checkpoints), replication and the
//! controller link. When that room is used up, accepting waits, as at `max.connections`,
//! so sockets can never starve a partition of the files it needs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::tls::FrameHint;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Bytes a frame's buffer starts with and the least it grows by.
const FIRST_CHUNK: usize = 64 << 10;

/// The most a frame's buffer grows by at once: the memory taken ahead of the bytes that
/// arrive, so a stalled frame holds about what it sent.
const MAX_STEP: usize = 1 << 20;

/// Each connection's own request memory, beside the shared budgets: a frame of at most this
/// size is never kept waiting by other connections (see the module doc).
pub const FLOOR_BYTES: usize = 64 << 10;

/// The least the pre-authentication budget holds.
const MIN_PRE_AUTH: usize = 1 << 20;

/// A frame larger than [`FLOOR_BYTES`] that has received no byte for this long, while
/// another frame waits for memory of its budget, is closed. Kafka clients send a frame's
/// bytes back to back: one quiet this long is broken or hostile.
pub const STALLED: Duration = Duration::from_secs(5);

/// How often a refused-connection warning may be logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What the listeners count, for /metrics.
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Open client connections, all listeners.
    pub connections: AtomicU64,
    /// Connections closed at accept because their address had `max.connections.per.ip`.
    pub refused_per_ip: AtomicU64,
    /// Times the accept loop paused because `max.connections` were open.
    pub accept_paused: AtomicU64,
    /// Request bytes read and not yet answered (`queued.max.request.bytes` in use).
    pub request_memory: AtomicU64,
    /// Reads that waited for request memory.
    pub request_memory_waits: AtomicU64,
    /// Bytes of frames read before authentication and not yet answered (their own budget).
    pub pre_auth_memory: AtomicU64,
    /// Frames read on their connection's own floor because their budget was in use.
    pub floor_reads: AtomicU64,
    /// Frames closed for being stalled while another frame waited for memory.
    pub stalled_frames_closed: AtomicU64,
    /// Open file descriptors of the process at the last count, and its limit.
    pub open_fds: AtomicU64,
    pub fd_limit: AtomicU64,
    /// Fetch sessions open, the partitions they hold, and sessions evicted or refused.
    pub fetch_sessions: AtomicU64,
    pub fetch_session_partitions: AtomicU64,
    pub fetch_sessions_evicted: AtomicU64,
    pub fetch_sessions_refused: AtomicU64,
    /// Incremental fetch requests served.
    pub fetch_incremental: AtomicU64,
}

/// The limits, shared by every listener of a broker.
pub struct Limits {
    max_connections: usize,
    per_ip: usize,
    overrides: HashMap<IpAddr, usize>,
    open: Mutex<Open>,
    freed: Notify,
    memory: Arc<Semaphore>,
    pre_auth: Arc<Semaphore>,
    /// Frames over `FLOOR_BYTES` being read, for closing the stalled ones.
    partials: Mutex<Partials>,
    stats: Arc<ListenerStats>,
    /// Connections the file descriptors leave room for (see the module doc).
    fd_room: std::sync::atomic::AtomicUsize,
    /// The broker's fetch sessions (KIP-227).
    fetch_sessions: super::fetch_session::Cache,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_ip: HashMap<IpAddr, usize>,
    /// Warnings for refused connections and for pauses, each at most every 10 s.
    refused: WarnEvery,
    paused: WarnEvery,
}

/// Counts occurrences of something worth a warning, and says when one is due: at the first,
/// then at most every 10 s, so that a flood of them costs a line per 10 s, not per event.
#[derive(Default)]
pub struct WarnEvery {
    since_warning: u64,
    warned_at: Option<Instant>,
}

impl WarnEvery {
    /// Counts one occurrence; `Some(n)` when a warning is due, `n` the occurrences it covers.
    pub fn due(&mut self) -> Option<u64> {
        self.since_warning += 1;
        if self.warned_at.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return None;
        }
        self.warned_at = Some(Instant::now());
        Some(std::mem::take(&mut self.since_warning))
    }
}

/// The large frames being read, by a number of their own.
#[derive(Default)]
struct Partials {
    next: u64,
    frames: HashMap<u64, Partial>,
    /// When a waiting frame last looked for stalled ones: one look per `STALLED / 5`
    /// serves every waiter (a thousand waiting frames must not each walk a thousand others
    /// every second under this lock).
    looked: Option<tokio::time::Instant>,
    /// Warnings for closed stalled frames, at most every 10 s.
    closed: WarnEvery,
}

struct Partial {
    budget: Budget,
    /// When the frame last received bytes or got memory.
    progress: tokio::time::Instant,
    /// Whether it is waiting for memory (not stalled, then, whatever `progress` says).
    waiting: bool,
    held: u64,
    close: Arc<Notify>,
}

/// A large frame's place in [`Partials`], removed when dropped.
struct Registered<'a> {
    limits: &'a Limits,
    id: u64,
    close: Arc<Notify>,
}

impl Registered<'_> {
    /// The frame received bytes or memory (`waiting` false), or starts waiting for memory.
    fn progress(&self, held: u64, waiting: bool) {
        if let Some(p) = self.limits.partials().frames.get_mut(&self.id) {
            p.progress = tokio::time::Instant::now();
            p.held = held;
            p.waiting = waiting;
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.limits.partials().frames.remove(&self.id);
    }
}

/// The settings `Limits` is built from.
#[derive(Debug, Clone)]
pub struct LimitsConfig {
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub max_connections_per_ip_overrides: HashMap<IpAddr, usize>,
    pub queued_max_request_bytes: usize,
    /// Fetch sessions the broker keeps (`max.incremental.fetch.session.cache.slots`) and
    /// the partitions they may hold between them.
    pub fetch_session_cache_slots: usize,
    pub fetch_session_cache_partitions: usize,
}

/// A connection's place under the limits; dropping it frees the place.
pub struct Slot {
    limits: Arc<Limits>,
    ip: IpAddr,
}

/// A frame's share of the request memory, returned when dropped.
#[derive(Debug)]
pub struct MemoryShare {
    permit: Option<OwnedSemaphorePermit>,
    bytes: u64,
    /// Whether the bytes are pre-authentication budget (counted apart in the stats).
    pre_auth: bool,
    stats: Arc<ListenerStats>,
}

/// One connection's own request memory ([`FLOOR_BYTES`]); see the module doc.
#[derive(Debug)]
pub struct Floor(Arc<Semaphore>);

impl Default for Floor {
    fn default() -> Floor {
        Floor(Arc::new(Semaphore::new(FLOOR_BYTES)))
    }
}

/// Which budget a frame draws on: the connection has authenticated, or not yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    Authenticated,
    PreAuthentication,
}

impl Limits {
    pub fn new(config: &LimitsConfig, stats: Arc<ListenerStats>) -> Arc<Limits> {
        Arc::new(Limits {
            max_connections: config.max_connections,
            per_ip: config.max_connections_per_ip,
            overrides: config.max_connections_per_ip_overrides.clone(),
            open: Mutex::new(Open::default()),
            freed: Notify::new(),
            memory: Arc::new(Semaphore::new(
                config.queued_max_request_bytes.min(Semaphore::MAX_PERMITS),
            )),
            pre_auth: Arc::new(Semaphore::new(pre_auth_bytes(
                config.queued_max_request_bytes,
            ))),
            partials: Mutex::default(),
            fetch_sessions: super::fetch_session::Cache::new(
                config.fetch_session_cache_slots,
                config.fetch_session_cache_partitions,
                stats.clone(),
            ),
            stats,
            fd_room: std::sync::atomic::AtomicUsize::new(usize::MAX),
        })
    }

    /// The broker's fetch sessions, shared by its listeners.
    pub fn fetch_sessions(&self) -> &super::fetch_session::Cache {
        &self.fetch_sessions
    }

    /// How many connections may be open now: `max.connections`, or fewer when the file
    /// descriptors leave less room.
    fn ceiling(&self) -> usize {
        self.max_connections.min(self.fd_room.load(Relaxed))
    }

    /// Counts the process's open file descriptors every second and sets the room client
    /// connections have under the limit (see the module doc), until `stop`.
    pub async fn watch_fds(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let Some(limit) = fd_limit() else {
            tracing::warn!("the file descriptor limit is unknown; only kafka.max_connections bounds client connections");
            return;
        };
        let reserve = fd_reserve(limit);
        self.stats.fd_limit.store(limit, Relaxed);
        let mut warned = false;
        loop {
            if let Some(open) = open_fds() {
                let connections = self.lock().total as u64;
                let others = open.saturating_sub(connections);
                let room = limit.saturating_sub(others + reserve) as usize;
                let before = self.fd_room.swap(room, Relaxed);
                self.stats.open_fds.store(open, Relaxed);
                if room < self.max_connections && !warned {
                    warned = true;
                    tracing::warn!(limit, open, reserve, room, max_connections = self.max_connections, "the file descriptor limit leaves room for fewer client connections than kafka.max_connections; raise the limit (LimitNOFILE=) to allow more");
                }
                if room > before {
                    self.freed.notify_waiters();
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Resolves once fewer than `max.connections` are open. The accept loop waits here, so
    /// further clients queue in the listen backlog, as with Kafka's acceptor.
    pub async fn room(&self) {
        let mut paused = false;
        loop {
            let freed = self.freed.notified();
            let ceiling = self.ceiling();
            if self.lock().total < ceiling {
                return;
            }
            if !paused {
                paused = true;
                self.stats.accept_paused.fetch_add(1, Relaxed);
                if let Some(pauses) = self.lock().paused.due() {
                    tracing::warn!(
                        open = ceiling,
                        max_connections = self.max_connections,
                        pauses,
                        "no room for another connection (kafka.max_connections, or the file descriptors the log engine keeps); new connections wait until one closes"
                    );
                }
            }
            freed.await;
        }
    }

    /// A place for a connection from `ip`, or `None` when that address already holds its
    /// `max.connections.per.ip` (the caller closes the connection).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let allowed = self.overrides.get(&ip).copied().unwrap_or(self.per_ip);
        let mut open = self.lock();
        let held = open.by_ip.get(&ip).copied().unwrap_or(0);
        if held >= allowed {
            self.stats.refused_per_ip.fetch_add(1, Relaxed);
            if let Some(refused) = open.refused.due() {
                tracing::warn!(
                    %ip,
                    max = allowed,
                    refused,
                    "max.connections.per.ip reached; closing new connections from this address"
                );
            }
            return None;
        }
        open.by_ip.insert(ip, held + 1);
        open.total += 1;
        self.stats.connections.fetch_add(1, Relaxed);
        Some(Slot {
            limits: self.clone(),
            ip,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn partials(&self) -> std::sync::MutexGuard<'_, Partials> {
        self.partials.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, budget: Budget) -> Registered<'_> {
        let mut partials = self.partials();
        let id = partials.next;
        partials.next += 1;
        let close = Arc::new(Notify::new());
        partials.frames.insert(
            id,
            Partial {
                budget,
                progress: tokio::time::Instant::now(),
                waiting: false,
                held: 0,
                close: close.clone(),
            },
        );
        Registered {
            limits: self,
            id,
            close,
        }
    }

    /// Closes every frame of `budget` but `waiter` that holds memory and has received
    /// nothing for [`STALLED`].
    fn close_stalled(&self, budget: Budget, waiter: u64) {
        let mut partials = self.partials();
        let now = tokio::time::Instant::now();
        if partials.looked.is_some_and(|at| now < at + STALLED / 5) {
            return;
        }
        partials.looked = Some(now);
        let stalled: Vec<u64> = partials
            .frames
            .iter()
            .filter(|(id, p)| {
                **id != waiter
                    && p.budget == budget
                    && !p.waiting
                    && p.held > 0
                    && p.progress.elapsed() >= STALLED
            })
            .map(|(id, _)| *id)
            .collect();
        if stalled.is_empty() {
            return;
        }
        let mut bytes = 0;
        for id in &stalled {
            if let Some(p) = partials.frames.remove(id) {
                bytes += p.held;
                p.close.notify_one();
            }
        }
        self.stats
            .stalled_frames_closed
            .fetch_add(stalled.len() as u64, Relaxed);
        if let Some(closed) = partials.closed.due() {
            tracing::warn!(
                frames = stalled.len(),
                bytes,
                closed,
                ?budget,
                "closing request frames that received nothing for 5 s while another frame waited for request memory"
            );
        }
    }

    /// Takes `bytes` of `memory` for the registered frame `me`, waiting while it is all in
    /// use; meanwhile stalled frames of the same budget are closed.
    async fn take(
        &self,
        share: &mut MemoryShare,
        memory: &Arc<Semaphore>,
        bytes: usize,
        budget: Budget,
        me: &Registered<'_>,
    ) {
        let n = bytes as u32; // a frame is at most kafka.max_request_bytes (i32)
        if let Ok(p) = memory.clone().try_acquire_many_owned(n) {
            return share.hold(p);
        }
        self.stats.request_memory_waits.fetch_add(1, Relaxed);
        me.progress(share.bytes, true);
        let acquire = memory.clone().acquire_many_owned(n);
        tokio::pin!(acquire);
        loop {
            // Only for a logged-in client's request: frames before authentication are small
            // when they are a client's (logins are read on the floor), so a waiting large
            // one is as likely as the stalled ones to be hostile, and freeing memory for it
            // would only make the stalled connections churn.
            if budget == Budget::Authenticated {
                self.close_stalled(budget, me.id);
            }
            tokio::select! {
                p = &mut acquire => {
                    share.hold(p.expect("the request memory is never closed"));
                    me.progress(share.bytes, false);
                    return;
                }
                _ = tokio::time::sleep(STALLED / 5) => {}
            }
        }
    }

    /// Reads a `size`-byte frame body from `rd` for a connection with its own `floor`,
    /// drawing on `budget`. The buffer grows as bytes arrive (doubling from 64 KiB, at most
    /// 1 MiB at a time), and each read first takes its bytes from the budget, waiting while
    /// it is all in use; a frame of at most [`FLOOR_BYTES`] is read on the floor instead
    /// when the budget is short. `hint` is told how much of the frame is still to come (a
    /// TLS connection's socket sleeps until a good part of it is there).
    pub async fn read_frame<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        size: usize,
        budget: Budget,
        floor: &Floor,
        hint: Option<&FrameHint>,
    ) -> std::io::Result<(BytesMut, MemoryShare)> {
        let read = self.read_frame_hinted(rd, size, budget, floor, hint).await;
        if let Some(hint) = hint {
            hint.still_needs(0);
        }
        read
    }

    async fn read_frame_hinted<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        size: usize,
        budget: Budget,
        floor: &Floor,
        hint: Option<&FrameHint>,
    ) -> std::io::Result<(BytesMut, MemoryShare)> {
        let pre_auth = budget == Budget::PreAuthentication;
        let mut share = MemoryShare {
            permit: None,
            bytes: 0,
            pre_auth,
            stats: self.stats.clone(),
        };
        let memory = if pre_auth {
            &self.pre_auth
        } else {
            &self.memory
        };
        let mut frame = BytesMut::new();
        if size <= FLOOR_BYTES {
            share.take_small(memory, &floor.0, size).await;
            frame.reserve(size);
            while frame.len() < size {
                read_into(rd, &mut frame, size, size, hint).await?;
            }
            return Ok((frame, share));
        }
        let me = self.register(budget);
        let read = async {
            while frame.len() < size {
                let want = (size - frame.len()).min(frame.len().clamp(FIRST_CHUNK, MAX_STEP));
                self.take(&mut share, memory, want, budget, &me).await;
                frame.reserve(want);
                let target = frame.len() + want;
                while frame.len() < target {
                    read_into(rd, &mut frame, target, size, hint).await?;
                    me.progress(share.bytes, false);
                }
            }
            Ok(())
        };
        tokio::select! {
            read = read => read.map(|()| (frame, share)),
            _ = me.close.notified() => Err(std::io::Error::other(
                "request frame stalled while others waited for request memory",
            )),
        }
    }
}

/// One read of what has arrived of a `size`-byte frame into `frame`, up to `target` bytes.
async fn read_into<R: AsyncRead + Unpin>(
    rd: &mut R,
    frame: &mut BytesMut,
    target: usize,
    size: usize,
    hint: Option<&FrameHint>,
) -> std::io::Result<()> {
    if let Some(hint) = hint {
        hint.still_needs(size - frame.len());
    }
    let left = (target - frame.len()) as u64;
    if (&mut *rd).take(left).read_buf(frame).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Raises the soft file-descriptor limit to the hard one, as servers do at start; returns
/// (before, after), or `None` when the limit cannot be read.
pub fn raise_fd_limit() -> Option<(u64, u64)> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    let before = l.current?;
    if l.current < l.maximum {
        l.current = l.maximum;
        if setrlimit(Resource::Nofile, l).is_err() {
            return Some((before, before));
        }
    }
    Some((before, fd_limit()?))
}

/// The soft file-descriptor limit, `None` when unlimited or unknown.
pub fn fd_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Descriptors kept from client connections under a limit of `limit`.
pub fn fd_reserve(limit: u64) -> u64 {
    (limit / 8).max(64)
}

/// The process's open file descriptors, counted in /proc (Linux).
fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// The pre-authentication budget that goes with a pool of `queued` bytes.
fn pre_auth_bytes(queued: usize) -> usize {
    (queued / 16).clamp(MIN_PRE_AUTH, Semaphore::MAX_PERMITS)
}

impl MemoryShare {
    /// Takes a whole small frame's `bytes` from `memory`, or from the connection's `floor`
    /// when `memory` is short; waits only while both are (the connection's own earlier
    /// requests hold its floor).
    async fn take_small(&mut self, memory: &Arc<Semaphore>, floor: &Arc<Semaphore>, bytes: usize) {
        let n = bytes as u32; // at most FLOOR_BYTES
        if let Ok(p) = memory.clone().try_acquire_many_owned(n) {
            return self.hold(p);
        }
        self.stats.floor_reads.fetch_add(1, Relaxed);
        let permit = match floor.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(_) => {
                self.stats.request_memory_waits.fetch_add(1, Relaxed);
                tokio::select! {
                    p = memory.clone().acquire_many_owned(n) => p,
                    p = floor.clone().acquire_many_owned(n) => p,
                }
                .expect("the request memory is never closed")
            }
        };
        self.hold(permit);
    }

    fn hold(&mut self, permit: OwnedSemaphorePermit) {
        let bytes = permit.num_permits() as u64;
        self.stats.request_memory.fetch_add(bytes, Relaxed);
        if self.pre_auth {
            self.stats.pre_auth_memory.fetch_add(bytes, Relaxed);
        }
        self.bytes += bytes;
        match &mut self.permit {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
    }
}

impl Drop for MemoryShare {
    fn drop(&mut self) {
        self.stats.request_memory.fetch_sub(self.bytes, Relaxed);
        if self.pre_auth {
            self.stats.pre_auth_memory.fetch_sub(self.bytes, Relaxed);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.limits.lock();
        open.total -= 1;
        if let Some(n) = open.by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.by_ip.remove(&self.ip);
            }
        }
        drop(open);
        self.limits.stats.connections.fetch_sub(1, Relaxed);
        self.limits.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_ip: usize, total: usize, memory: usize) -> Arc<Limits> {
        Limits::new(
            &LimitsConfig {
                max_connections: total,
                max_connections_per_ip: per_ip,
                max_connections_per_ip_overrides: HashMap::from([("10.0.0.9".parse().unwrap(), 5)]),
                queued_max_request_bytes: memory,
                fetch_session_cache_slots: 10,
                fetch_session_cache_partitions: 100,
            },
            Arc::default(),
        )
    }

    #[test]
    fn an_address_gets_its_limit_or_its_override_and_a_closed_slot_is_given_back() {
        let l = limits(2, 100, 1 << 20);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let (s1, s2) = (l.admit(a).unwrap(), l.admit(a).unwrap());
        assert!(l.admit(a).is_none(), "a third connection from one address");
        assert!(l.admit("10.0.0.2".parse().unwrap()).is_some());
        let b: IpAddr = "10.0.0.9".parse().unwrap();
        let held: Vec<_> = (0..5).map(|_| l.admit(b).unwrap()).collect();
        assert!(l.admit(b).is_none(), "the override allows five");
        drop(s1);
        assert!(l.admit(a).is_some());
        assert_eq!(l.stats.refused_per_ip.load(Relaxed), 2);
        drop((s2, held));
    }

    #[test]
    fn a_flood_of_warnings_is_one_line_per_ten_seconds_with_the_count() {
        let mut w = WarnEvery::default();
        assert_eq!(w.due(), Some(1), "the first is logged");
        assert_eq!((w.due(), w.due()), (None, None));
        w.warned_at = w.warned_at.and_then(|at| at.checked_sub(WARN_EVERY));
        assert_eq!(w.due(), Some(3), "the next line counts the two held back");
    }

    #[tokio::test]
    async fn the_accept_loop_waits_for_room_until_a_connection_closes() {
        let l = limits(10, 2, 1 << 20);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let s1 = l.admit(ip).unwrap();
        let _s2 = l.admit(ip).unwrap();
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.room().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "two of two connections are open");
        drop(s1);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room once a connection closed")
            .unwrap();
    }

    #[tokio::test]
    async fn connections_get_only_the_room_the_file_descriptors_leave() {
        let l = limits(10, 100, 1 << 20);
        l.fd_room.store(1, Relaxed);
        let _s = l.admit("10.0.0.1".parse().unwrap()).unwrap();
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.room().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "one of one connection the fds allow is open"
        );
        // the next count finds more room (a partition closed its segments, say)
        l.fd_room.store(2, Relaxed);
        l.freed.notify_waiters();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room once the descriptors allow it")
            .unwrap();
        assert_eq!(fd_reserve(256), 64);
        assert_eq!(fd_reserve(1 << 20), 1 << 17);
    }

    /// Over TLS, the socket's low-water mark is raised while a large frame streams in, and
    /// however the client's writes split a frame, its last bytes never wait behind the mark
    /// (the listener's frame timeout would close the connection). Each frame is sent only
    /// after the one before was read, so nothing else arrives to lift the mark.
    #[tokio::test]
    async fn frames_over_tls_are_read_whole_however_their_bytes_arrive() {
        use super::super::tls::ReadAhead;
        use tokio::io::AsyncWriteExt;

        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = cert.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sizes = [
            3,
            100 << 10,
            97 << 10,
            1 << 20,
            300 << 10,
            130 << 10,
            5 << 20,
        ];
        let frame =
            |i: usize, size: usize| (0..size).map(|j| (i + j % 251) as u8).collect::<Vec<u8>>();
        let (read_tx, mut read_rx) = tokio::sync::mpsc::channel::<()>(1);
        let writer = tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
                .connect(name, tcp)
                .await
                .unwrap();
            for (i, &size) in sizes.iter().enumerate() {
                let bytes = frame(i, size);
                // chunks of uneven sizes, then a pause before a tail of a few bytes
                let tail = size - (1 + i * 7) % size.min(4096);
                let mut at = 0;
                for chunk in [1000, 16 << 10, 70_000, 5, 200 << 10].iter().cycle() {
                    let end = (at + chunk).min(tail);
                    tls.write_all(&bytes[at..end]).await.unwrap();
                    tls.flush().await.unwrap();
                    at = end;
                    if at == tail {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
                tls.write_all(&bytes[tail..]).await.unwrap();
                tls.flush().await.unwrap();
                read_rx.recv().await.expect("the reader stopped");
            }
        });
        let (tcp, _) = listener.accept().await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let hint = FrameHint::default();
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(server))
            .accept(ReadAhead::with_hint(tcp, hint.clone()))
            .await
            .unwrap();
        let (mut rd, _wr) = tokio::io::split(tls);
        let l = limits(10, 10, 64 << 20);
        for (i, &size) in sizes.iter().enumerate() {
            let floor = Floor::default();
            let read = l.read_frame(&mut rd, size, Budget::Authenticated, &floor, Some(&hint));
            let (got, _share) = tokio::time::timeout(Duration::from_secs(5), read)
                .await
                .unwrap_or_else(|_| panic!("frame {i} ({size} bytes) waited behind the mark"))
                .unwrap();
            assert!(got[..] == frame(i, size)[..], "frame {i} read wrong");
            read_tx.send(()).await.unwrap();
        }
        writer.await.unwrap();
        assert!(
            hint.raised() >= 4,
            "the mark was raised {} times for 5 large frames",
            hint.raised()
        );
    }

    #[tokio::test]
    async fn a_frame_grows_with_its_bytes_and_reads_wait_for_request_memory() {
        let l = limits(10, 10, 200 << 10);
        // a 1 MiB frame of which 100 KiB arrived: the buffer holds about what arrived
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        // as the listener does: the frame timeout ends a frame that waits too long
        let reading = tokio::spawn({
            let l = l.clone();
            async move {
                let floor = Floor::default();
                let read = l.read_frame(&mut server, 1 << 20, Budget::Authenticated, &floor, None);
                tokio::time::timeout(Duration::from_millis(500), read).await
            }
        });
        tokio::io::AsyncWriteExt::write_all(&mut client, &vec![7u8; 100 << 10])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let held = l.stats.request_memory.load(Relaxed);
        assert!(
            (100 << 10..=192 << 10).contains(&held),
            "request memory held for 100 KiB received: {held}"
        );
        // the pool (200 KiB) is short of the next chunk: the read waits
        tokio::io::AsyncWriteExt::write_all(&mut client, &vec![7u8; 100 << 10])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!reading.is_finished());
        assert!(l.stats.request_memory_waits.load(Relaxed) >= 1);
        assert!(reading.await.unwrap().is_err(), "the frame timed out");
        drop(client);
        assert_eq!(
            l.stats.request_memory.load(Relaxed),
            0,
            "a frame that timed out returns its share"
        );
        // a whole frame is read and its share lasts as long as the share is held
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut client, &[1, 2, 3])
            .await
            .unwrap();
        let (frame, share) = l
            .read_frame(
                &mut server,
                3,
                Budget::Authenticated,
                &Floor::default(),
                None,
            )
            .await
            .unwrap();
        assert_eq!(&frame[..], &[1, 2, 3]);
        assert_eq!(l.stats.request_memory.load(Relaxed), 3);
        drop(share);
        assert_eq!(l.stats.request_memory.load(Relaxed), 0);
    }

    /// A small frame's bytes, sent whole on a fresh in-memory connection, read with `l`.
    async fn small_frame(
        l: &Limits,
        size: usize,
        budget: Budget,
        floor: &Floor,
    ) -> std::io::Result<(BytesMut, MemoryShare)> {
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut client, &vec![9u8; size]).await?;
        let read = l.read_frame(&mut server, size, budget, floor, None);
        tokio::time::timeout(Duration::from_millis(500), read)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
    }

    /// Issue 47: eight connections stalled 60 MiB into 100 MiB frames took the whole pool
    /// (each had taken 64 MiB ahead of its bytes), and every other client's requests waited
    /// for the frame timeout. Now a stalled frame holds about what it sent, and a small frame
    /// that finds the pool in use is read on its connection's own floor.
    #[tokio::test]
    async fn a_pool_full_of_stalled_frames_still_reads_everyone_elses_small_requests() {
        let l = limits(10, 10, 4 << 20);
        let (mut client, mut server) = tokio::io::duplex(8 << 20);
        let stalled = tokio::spawn({
            let l = l.clone();
            async move {
                let floor = Floor::default();
                let read =
                    l.read_frame(&mut server, 100 << 20, Budget::Authenticated, &floor, None);
                tokio::time::timeout(Duration::from_secs(2), read).await
            }
        });
        // 3.5 MiB of the frame arrives: the pool is held to what arrived and one step more
        tokio::io::AsyncWriteExt::write_all(&mut client, &vec![7u8; 7 << 19])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let held = l.stats.request_memory.load(Relaxed);
        assert!(
            (7 << 19..=(7 << 19) + (1 << 20)).contains(&(held as usize)),
            "a frame 3.5 MiB in holds {held} bytes"
        );
        // the rest of the pool goes to a second stalled frame
        let (_c2, mut s2) = tokio::io::duplex(1 << 20);
        let _second = l
            .memory
            .clone()
            .try_acquire_many_owned(l.memory.available_permits() as u32)
            .unwrap();
        assert_eq!(l.memory.available_permits(), 0);
        // another connection's small requests are read at once, on its floor
        let floor = Floor::default();
        let (a, share_a) = small_frame(&l, 40 << 10, Budget::Authenticated, &floor)
            .await
            .expect("a small frame read beside a full pool");
        assert_eq!(a.len(), 40 << 10);
        let (_, share_b) = small_frame(&l, 20 << 10, Budget::Authenticated, &floor)
            .await
            .expect("a second small request of the same connection fits its floor");
        assert_eq!(l.stats.floor_reads.load(Relaxed), 2);
        // the connection's own floor is spent: its next request waits for its answers
        assert!(
            small_frame(&l, 8 << 10, Budget::Authenticated, &floor)
                .await
                .is_err(),
            "a connection past its own floor waits"
        );
        drop(share_a);
        small_frame(&l, 8 << 10, Budget::Authenticated, &floor)
            .await
            .expect("read once its own request was answered");
        drop(share_b);
        // a frame over the floor waits for the pool as before
        let mut s2_read =
            Box::pin(l.read_frame(&mut s2, 1 << 20, Budget::Authenticated, &floor, None));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut s2_read)
                .await
                .is_err(),
            "a 1 MiB frame waits while the pool is in use"
        );
        drop(client);
        assert!(
            stalled.await.unwrap().unwrap().is_err(),
            "the stalled frame ended"
        );
    }

    /// Issue 47: 1,100 connections that never authenticated, each 512 KiB into a frame, held
    /// the whole pool and a SCRAM login waited 28 s. Frames before authentication draw on a
    /// budget of their own: those connections fill it, and neither a login's small frames
    /// nor an authenticated client's large ones wait for them.
    #[tokio::test]
    async fn frames_before_authentication_have_a_budget_of_their_own() {
        let l = limits(10, 10, 32 << 20);
        assert_eq!(
            l.pre_auth.available_permits(),
            2 << 20,
            "a sixteenth of the pool"
        );
        assert_eq!(pre_auth_bytes(4 << 20), 1 << 20, "at least 1 MiB");
        let mut clients = Vec::new();
        let mut readers = Vec::new();
        for _ in 0..6 {
            let (mut client, mut server) = tokio::io::duplex(1 << 20);
            tokio::io::AsyncWriteExt::write_all(&mut client, &vec![1u8; 500 << 10])
                .await
                .unwrap();
            clients.push(client);
            let l = l.clone();
            readers.push(tokio::spawn(async move {
                let floor = Floor::default();
                l.read_frame(
                    &mut server,
                    512 << 10,
                    Budget::PreAuthentication,
                    &floor,
                    None,
                )
                .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pre = l.stats.pre_auth_memory.load(Relaxed);
        assert!(pre <= 2 << 20, "pre-authentication frames hold {pre} bytes");
        assert_eq!(l.pre_auth.available_permits() as u64, (2 << 20) - pre);
        assert!(
            l.pre_auth.available_permits() < 64 << 10,
            "the budget is spent"
        );
        // a login's next message is read on the connection's floor
        small_frame(&l, 300, Budget::PreAuthentication, &Floor::default())
            .await
            .expect("a SASL message read beside stalled unauthenticated frames");
        // and an authenticated client's 4 MiB request draws on the pool, untouched by them
        let (mut client, mut server) = tokio::io::duplex(8 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut client, &vec![2u8; 4 << 20])
            .await
            .unwrap();
        let floor = Floor::default();
        let read = l.read_frame(&mut server, 4 << 20, Budget::Authenticated, &floor, None);
        let (frame, _share) = tokio::time::timeout(Duration::from_millis(500), read)
            .await
            .expect("an authenticated frame is not held back by unauthenticated ones")
            .unwrap();
        assert_eq!(frame.len(), 4 << 20);
        drop(clients);
        for r in readers {
            assert!(r.await.unwrap().is_err());
        }
        assert_eq!(l.stats.pre_auth_memory.load(Relaxed), 0);
    }

    /// Issue 47: stalled large frames kept the pool until the frame timeout (30 s), so an
    /// authenticated client's large request waited that long. While a frame waits for
    /// memory, frames of its budget quiet for 5 s are closed and their memory is its.
    #[tokio::test(start_paused = true)]
    async fn a_frame_waiting_for_memory_closes_the_stalled_ones_after_five_seconds() {
        let l = limits(10, 10, 2 << 20);
        let (mut stalled_client, mut stalled_server) = tokio::io::duplex(4 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut stalled_client, &vec![1u8; 3 << 19])
            .await
            .unwrap();
        let stalled = tokio::spawn({
            let l = l.clone();
            async move {
                let floor = Floor::default();
                l.read_frame(
                    &mut stalled_server,
                    100 << 20,
                    Budget::Authenticated,
                    &floor,
                    None,
                )
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            l.memory.available_permits(),
            0,
            "the stalled frame holds the pool"
        );
        // a pre-authentication frame waiting for its own budget closes nothing
        let _pre = l.pre_auth.clone().try_acquire_many_owned(1 << 20).unwrap();
        let (mut pre_client, mut pre_server) = tokio::io::duplex(1 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut pre_client, &vec![3u8; 100 << 10])
            .await
            .unwrap();
        let pre = tokio::spawn({
            let l = l.clone();
            async move {
                let floor = Floor::default();
                let read = l.read_frame(
                    &mut pre_server,
                    100 << 10,
                    Budget::PreAuthentication,
                    &floor,
                    None,
                );
                tokio::time::timeout(Duration::from_secs(20), read).await
            }
        });
        // a whole 1 MiB request arrives and waits for the pool
        let (mut client, mut server) = tokio::io::duplex(2 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut client, &vec![2u8; 1 << 20])
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let floor = Floor::default();
        let read = l.read_frame(&mut server, 1 << 20, Budget::Authenticated, &floor, None);
        let (frame, _share) = tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("the stalled frame was never closed")
            .expect("the waiting frame is read once the stalled one is closed");
        let waited = started.elapsed();
        assert_eq!(frame.len(), 1 << 20);
        assert!(
            (STALLED - Duration::from_millis(20)..=STALLED + STALLED / 4).contains(&waited),
            "read after {waited:?}"
        );
        let closed = stalled.await.unwrap().unwrap_err();
        assert!(closed.to_string().contains("stalled"), "{closed}");
        assert_eq!(l.stats.stalled_frames_closed.load(Relaxed), 1);
        assert!(
            pre.await.unwrap().is_err(),
            "the pre-authentication frame still waits: nothing of its budget was stalled"
        );
        drop((stalled_client, pre_client, client));
    }
}
