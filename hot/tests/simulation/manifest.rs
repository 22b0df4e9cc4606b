//! The cold tier's manifest writers, interleaved: the real `ManifestStore` (its reads,
//! create-only puts, listings and deletions of old versions) over an in-memory object store
//! whose every call yields once, so a seeded scheduler decides which writer's next call
//! runs. Writers are leaders (a claim at each new epoch, then uploads), whose elections
//! depose the writers still in flight, and a compactor (unfenced, replacing one segment
//! with its rewrite). Any writer may stall for a long stretch between two calls, as a
//! paused process or a slow link does, while the others write many versions and delete
//! the old ones.
//!
//! After every step: the manifest in the store loads and is valid; its leader epoch never
//! goes back; and every update `ManifestStore` answered Ok is in it (an uploaded segment,
//! or the compactor's rewrite of it).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures_util::stream::{BoxStream, StreamExt};
use futures_util::FutureExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use strata_cold::manifest::{Compacted, Manifest, ManifestError, ManifestStore, PartitionPrefix};

use crate::rng::Rng;

const STEPS: usize = 400;

/// Yields once: the scheduler's next poll of this writer runs the call.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

/// An in-memory store whose calls each wait for the writer's next turn, and are traced.
#[derive(Debug)]
struct Stepped {
    inner: Arc<InMemory>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Stepped {
    async fn turn(&self, what: String) {
        YieldOnce(false).await;
        self.log.lock().expect("log").push(what);
    }
}

impl std::fmt::Display for Stepped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stepped")
    }
}

fn name(p: &Path) -> &str {
    p.as_ref().rsplit('/').next().unwrap_or_default()
}

#[async_trait::async_trait]
impl ObjectStore for Stepped {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.turn(format!("put {}", name(location))).await;
        let r = self.inner.put_opts(location, payload, opts).await;
        if r.is_err() {
            self.log.lock().expect("log").push("  (exists)".into());
        }
        r
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.turn(format!("get {}", name(location))).await;
        self.inner.get_opts(location, options).await
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.turn(format!("delete {}", name(location))).await;
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let log = self.log.clone();
        let prefix = prefix.cloned();
        futures_util::stream::once(async move {
            YieldOnce(false).await;
            let listed: Vec<_> = inner.list(prefix.as_ref()).collect().await;
            let names: Vec<&str> = listed
                .iter()
                .filter_map(|o| o.as_ref().ok().map(|o| name(&o.location)))
                .map(|n| n.trim_start_matches('0'))
                .collect();
            log.lock().expect("log").push(format!("list: {names:?}"));
            futures_util::stream::iter(listed)
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

type Task = Pin<Box<dyn Future<Output = Result<Manifest, ManifestError>>>>;

enum Op {
    Claim,
    Upload { key: String },
    Compact { old: String, new: String },
}

struct Writer {
    name: String,
    /// The leader epoch it writes at (`None`: the compactor).
    epoch: Option<i32>,
    claimed: bool,
    task: Option<(Op, Task)>,
    stalled_until: usize,
}

fn prefix() -> PartitionPrefix {
    PartitionPrefix::new("sim", "topic", 0)
}

struct World {
    rng: Rng,
    raw: Arc<InMemory>,
    stepped: Arc<Stepped>,
    writers: Vec<Writer>,
    next_epoch: i32,
    next_key: u64,
    /// Segment keys whose update was answered Ok: each must be in the manifest, or a
    /// rewrite of it (the compactor's, answered or not).
    acked: BTreeSet<String>,
    /// Rewrites begun: old key -> new keys.
    rewrites: BTreeMap<String, Vec<String>>,
    highest_epoch: i32,
    trace: Vec<String>,
    step: usize,
    acks: u64,
}

impl World {
    fn new(seed: u64) -> Self {
        let raw = Arc::new(InMemory::new());
        let stepped = Arc::new(Stepped {
            inner: raw.clone(),
            log: Arc::default(),
        });
        let mut writers: Vec<Writer> = (1..=3)
            .map(|b| Writer {
                name: format!("b{b}"),
                epoch: None,
                claimed: false,
                task: None,
                stalled_until: 0,
            })
            .collect();
        writers[0].epoch = Some(1);
        writers.push(Writer {
            name: "compactor".into(),
            epoch: None,
            claimed: true,
            task: None,
            stalled_until: 0,
        });
        World {
            rng: Rng::new(seed),
            raw,
            stepped,
            writers,
            next_epoch: 2,
            next_key: 0,
            acked: BTreeSet::new(),
            rewrites: BTreeMap::new(),
            highest_epoch: 0,
            trace: Vec::new(),
            step: 0,
            acks: 0,
        }
    }

    /// The manifest in the store, read directly.
    fn truth(&self) -> Result<Manifest, String> {
        let store = ManifestStore::new(self.raw.clone(), prefix());
        match store.load().now_or_never() {
            Some(r) => r.map_err(|e| format!("the manifest does not load: {e}")),
            None => Err("an in-memory read did not complete".into()),
        }
    }

    fn start(&mut self, w: usize) -> Result<(), String> {
        let store = ManifestStore::new(self.stepped.clone(), prefix());
        let writer = &self.writers[w];
        let (op, task): (Op, Task) = match writer.epoch {
            Some(epoch) if !writer.claimed => {
                (Op::Claim, Box::pin(async move { store.claim(epoch).await }))
            }
            Some(epoch) => {
                self.next_key += 1;
                let key = format!("seg-{}", self.next_key);
                let size = 1 + self.rng.below(5);
                let k = key.clone();
                let task = Box::pin(async move {
                    store
                        .update(epoch, move |m| {
                            if m.segments.iter().any(|s| s.key == k) {
                                return Ok(None);
                            }
                            let base = m.end_offset();
                            let mut next = m.clone();
                            next.segments.push(strata_cold::manifest::RemoteSegment {
                                base_offset: base,
                                end_offset: base + size,
                                min_timestamp: 0,
                                max_timestamp: 0,
                                size_bytes: size,
                                leader_epoch: epoch,
                                key: k.clone(),
                                compacted: None,
                                aborted: Vec::new(),
                            });
                            Ok(Some(next))
                        })
                        .await
                });
                (Op::Upload { key }, task)
            }
            None if writer.name == "compactor" => {
                let m = self.truth()?;
                if m.segments.is_empty() {
                    return Ok(());
                }
                let old = m.segments[self.rng.below(m.segments.len() as u64) as usize]
                    .key
                    .clone();
                self.next_key += 1;
                let new = format!("cmp-{}", self.next_key);
                self.rewrites
                    .entry(old.clone())
                    .or_default()
                    .push(new.clone());
                let (o, n) = (old.clone(), new.clone());
                let task = Box::pin(async move {
                    store
                        .update_unfenced(move |m| {
                            // what it replaces must still be there
                            let Some(i) = m.segments.iter().position(|s| s.key == o) else {
                                return Ok(None);
                            };
                            let mut next = m.clone();
                            next.segments[i].key = n.clone();
                            next.segments[i].compacted = Some(Compacted {
                                at: 0,
                                tombstones: 0,
                                oldest_tombstone: -1,
                            });
                            Ok(Some(next))
                        })
                        .await
                });
                (Op::Compact { old, new }, task)
            }
            None => return Ok(()), // a broker that leads nothing
        };
        let what = match &op {
            Op::Claim => "claim".to_string(),
            Op::Upload { key } => format!("upload {key}"),
            Op::Compact { old, new } => format!("rewrite {old} as {new}"),
        };
        let epoch = writer
            .epoch
            .map_or(String::new(), |e| format!(" at epoch {e}"));
        self.trace.push(format!(
            "{:>4} {} starts: {what}{epoch}",
            self.step, writer.name
        ));
        self.writers[w].task = Some((op, task));
        Ok(())
    }

    fn finish(&mut self, w: usize, op: Op, result: Result<Manifest, ManifestError>) {
        let name = self.writers[w].name.clone();
        let line = match (&op, &result) {
            (_, Err(e)) => format!("fails: {e}"),
            (_, Ok(m)) => format!(
                "Ok: version {} epoch {} {:?}",
                m.version,
                m.leader_epoch,
                m.segments
                    .iter()
                    .map(|s| s.key.as_str())
                    .collect::<Vec<_>>()
            ),
        };
        self.trace.push(format!("{:>4} {name} {line}", self.step));
        let Ok(m) = result else {
            return;
        };
        self.acks += 1;
        match op {
            Op::Claim => self.writers[w].claimed = true,
            Op::Upload { key } => {
                self.acked.insert(key);
            }
            Op::Compact { new, .. } => {
                if m.segments.iter().any(|s| s.key == new) {
                    self.acked.insert(new);
                }
            }
        }
    }

    fn step(&mut self) -> Result<(), String> {
        self.step += 1;
        if self.rng.chance(15) {
            // An election: another broker leads at a new epoch; whatever the old leader
            // still has in flight carries on at its old epoch.
            let b = self.rng.below(3) as usize;
            let epoch = self.next_epoch;
            self.next_epoch += 1;
            for (i, w) in self.writers.iter_mut().enumerate().take(3) {
                if i == b {
                    w.epoch = Some(epoch);
                    w.claimed = false;
                } else {
                    w.epoch = None;
                }
            }
            self.trace.push(format!(
                "{:>4} b{} is elected at epoch {epoch}",
                self.step,
                b + 1
            ));
        }
        let w = self.rng.below(self.writers.len() as u64) as usize;
        if self.writers[w].stalled_until > self.step {
            return self.check();
        }
        if self.rng.chance(30) {
            let until = self.step + 20 + self.rng.below(120) as usize;
            self.writers[w].stalled_until = until;
            self.trace.push(format!(
                "{:>4} {} STALLS until step {until}",
                self.step, self.writers[w].name
            ));
            return self.check();
        }
        if self.writers[w].task.is_none() {
            self.start(w)?;
        }
        if let Some((op, mut task)) = self.writers[w].task.take() {
            let mut cx = Context::from_waker(Waker::noop());
            let polled = task.as_mut().poll(&mut cx);
            let name = self.writers[w].name.clone();
            for line in self.stepped.log.lock().expect("log").drain(..) {
                self.trace.push(format!("{:>4} {name}   {line}", self.step));
            }
            match polled {
                Poll::Pending => self.writers[w].task = Some((op, task)),
                Poll::Ready(result) => self.finish(w, op, result),
            }
        }
        self.check()
    }

    fn check(&mut self) -> Result<(), String> {
        let m = self.truth()?;
        if m.leader_epoch < self.highest_epoch {
            return Err(format!(
                "the manifest's leader epoch went back from {} to {}",
                self.highest_epoch, m.leader_epoch
            ));
        }
        self.highest_epoch = m.leader_epoch;
        let held: BTreeSet<&str> = m.segments.iter().map(|s| s.key.as_str()).collect();
        fn live(
            key: &str,
            held: &BTreeSet<&str>,
            rewrites: &BTreeMap<String, Vec<String>>,
        ) -> bool {
            held.contains(key)
                || rewrites
                    .get(key)
                    .is_some_and(|news| news.iter().any(|n| live(n, held, rewrites)))
        }
        for key in &self.acked {
            if !live(key, &held, &self.rewrites) {
                return Err(format!(
                    "the acknowledged update that wrote {key} is not in the manifest (version {}: {held:?})",
                    m.version
                ));
            }
        }
        Ok(())
    }
}

/// Runs one seed: the acknowledged updates, or the broken invariant; and the trace.
pub fn run(seed: u64) -> (Result<u64, String>, Vec<String>) {
    let mut w = World::new(seed);
    for _ in 0..STEPS {
        if let Err(e) = w.step() {
            return (Err(e), w.trace);
        }
    }
    (Ok(w.acks), w.trace)
}
