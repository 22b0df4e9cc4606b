//! The metadata log on disk: openraft's `RaftLogStorage`.
//!
//! Files in the controller directory:
//! - `raft-log`: records `[len u32][crc32c u32][json entry]`, appended and fsynced before
//!   openraft is told an append is durable; a torn tail is cut at open;
//! - `vote`, `committed`, `purged`: small JSON files replaced atomically.
//!
//! The log holds every SCRAM user's stored and server keys: the directory is made mode 700
//! and every file mode 600 (`strata_core::private_fs`).
//!
//! Entries stay in memory until purged (the metadata log is small and snapshots bound it).
//! File I/O runs on the blocking pool; the state behind the mutex is only touched there or
//! for in-memory reads.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{LogId, OptionalSend, RaftLogId, RaftLogReader, StorageError, StorageIOError, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use strata_core::private_fs;

use super::{Entry, NodeId, TypeConfig};

const LOG_FILE: &str = "raft-log";
const VOTE_FILE: &str = "vote";
const COMMITTED_FILE: &str = "committed";
const PURGED_FILE: &str = "purged";

struct LogInner {
    dir: PathBuf,
    file: File,
    /// index -> (entry, byte offset of its record)
    entries: BTreeMap<u64, (Entry, u64)>,
    end: u64,
    last_purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

/// The durable metadata log. Cloning shares it (the clone is also the log reader).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `value` as JSON to `dir/name` through a temporary file, rename and dir fsync.
pub(crate) fn write_json<T: Serialize>(dir: &Path, name: &str, value: &T) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    let mut f = private_fs::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

fn encode_record(entry: &Entry) -> io::Result<Vec<u8>> {
    let json = serde_json::to_vec(entry).map_err(io::Error::other)?;
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(&json).to_be_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Decodes the records in `bytes`; returns the entries with their offsets and the length of
/// the intact prefix (a torn or corrupt tail stops the scan).
fn decode_records(bytes: &[u8]) -> (Vec<(Entry, u64)>, u64) {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while bytes.len() - pos >= 8 {
        let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_be_bytes(bytes[pos + 4..pos + 8].try_into().expect("4 bytes"));
        let Some(body) = bytes.get(pos + 8..pos + 8 + len) else {
            break;
        };
        if crc32c::crc32c(body) != crc {
            break;
        }
        let Ok(entry) = serde_json::from_slice::<Entry>(body) else {
            break;
        };
        out.push((entry, pos as u64));
        pos += 8 + len;
    }
    (out, pos as u64)
}

impl LogInner {
    fn open(dir: &Path) -> io::Result<LogInner> {
        private_fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let file = private_fs::open_options()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)?;
        let bytes = fs::read(&path)?;
        let (records, intact) = decode_records(&bytes);
        if intact < bytes.len() as u64 {
            tracing::warn!(file = %path.display(), at = intact, len = bytes.len(), "cutting torn metadata log tail");
            file.set_len(intact)?;
            file.sync_all()?;
        }
        let last_purged: Option<LogId<NodeId>> = read_json(&dir.join(PURGED_FILE))?;
        let floor = last_purged.map_or(0, |l| l.index + 1);
        let entries = records
            .into_iter()
            .filter(|(e, _)| e.log_id.index >= floor)
            .map(|(e, off)| (e.log_id.index, (e, off)))
            .collect();
        Ok(LogInner {
            dir: dir.to_path_buf(),
            file,
            entries,
            end: intact,
            last_purged,
            vote: read_json(&dir.join(VOTE_FILE))?,
            committed: read_json(&dir.join(COMMITTED_FILE))?,
        })
    }

    fn append(&mut self, entries: Vec<Entry>) -> io::Result<()> {
        let mut buf = Vec::new();
        let mut placed = Vec::with_capacity(entries.len());
        for e in entries {
            let offset = self.end + buf.len() as u64;
            buf.extend_from_slice(&encode_record(&e)?);
            placed.push((e, offset));
        }
        self.file.write_all(&buf)?;
        self.file.sync_data()?;
        self.end += buf.len() as u64;
        for (e, off) in placed {
            self.entries.insert(e.log_id.index, (e, off));
        }
        Ok(())
    }

    /// Removes entries at and after `index`.
    fn truncate(&mut self, index: u64) -> io::Result<()> {
        let Some((_, (_, offset))) = self.entries.range(index..).next() else {
            return Ok(());
        };
        let offset = *offset;
        self.file.set_len(offset)?;
        self.file.sync_all()?;
        self.end = offset;
        self.entries.split_off(&index);
        Ok(())
    }

    /// Removes entries up to and including `log_id`, then rewrites the file without them.
    fn purge(&mut self, log_id: LogId<NodeId>) -> io::Result<()> {
        write_json(&self.dir, PURGED_FILE, &log_id)?;
        self.last_purged = Some(log_id);
        self.entries = self.entries.split_off(&(log_id.index + 1));
        let tmp = self.dir.join(format!("{LOG_FILE}.tmp"));
        let mut out = Vec::new();
        let mut rewritten = BTreeMap::new();
        for (idx, (e, _)) in std::mem::take(&mut self.entries) {
            let offset = out.len() as u64;
            out.extend_from_slice(&encode_record(&e)?);
            rewritten.insert(idx, (e, offset));
        }
        let mut f = private_fs::create(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join(LOG_FILE))?;
        File::open(&self.dir)?.sync_all()?;
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(self.dir.join(LOG_FILE))?;
        self.entries = rewritten;
        self.end = out.len() as u64;
        Ok(())
    }
}

impl LogStore {
    /// Opens (creating) the metadata log in `dir`.
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        Ok(LogStore {
            inner: Arc::new(Mutex::new(LogInner::open(dir)?)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the blocking pool with the log locked.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut LogInner) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&mut inner.lock().unwrap_or_else(|e| e.into_inner())))
            .await
            .map_err(io::Error::other)?
    }
}

#[cfg(test)]
impl LogStore {
    pub(crate) async fn blocking_append_for_tests(&self, entries: Vec<Entry>) -> io::Result<()> {
        self.blocking(move |inner| inner.append(entries)).await
    }
}

fn log_err(e: io::Error) -> StorageError<NodeId> {
    StorageIOError::write_logs(&e).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        Ok(self
            .lock()
            .entries
            .range(range)
            .map(|(_, (e, _))| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let inner = self.lock();
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|(e, _)| *e.get_log_id());
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last.or(inner.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let vote = *vote;
        self.blocking(move |inner| {
            write_json(&inner.dir, VOTE_FILE, &vote)?;
            inner.vote = Some(vote);
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.lock().vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.blocking(move |inner| {
            write_json(&inner.dir, COMMITTED_FILE, &committed)?;
            inner.committed = committed;
            Ok(())
        })
        .await
        .map_err(log_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let result = self.blocking(move |inner| inner.append(entries)).await;
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let err = log_err(io::Error::new(e.kind(), e.to_string()));
                callback.log_io_completed(Err(e));
                Err(err)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.blocking(move |inner| inner.truncate(log_id.index))
            .await
            .map_err(log_err)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.blocking(move |inner| inner.purge(log_id))
            .await
            .map_err(log_err)
    }
}
