//! A follower's fetch sessions: one per leader broker, shared by the fetchers of every
//! partition this broker follows there. A session is one gRPC connection and one
//! `FetchSession` stream: each fetcher's request goes out tagged, and a reader task hands
//! each tagged answer to the fetcher waiting for it. Partitions do not wait for each other;
//! what they share is the connection (one socket and one HTTP/2 stream per leader, not one
//! per partition, as Kafka's replica fetcher threads carry all of a source broker's
//! partitions).
//!
//! Against a leader that does not serve `FetchSession` (an older version, during a rolling
//! upgrade) the fetchers send unary `Fetch` calls over the session's connection. A session
//! that failed is replaced by the next fetcher that asks for one; one that fell back to
//! unary calls is probed again after a while.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use strata_proto::v1::replica_client::ReplicaClient;
use strata_proto::v1::{ReplicaFetchRequest, ReplicaFetchResponse};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::transport::Channel;

/// How long a session waits for the leader to accept it.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// A session whose leader answered without `FetchSession` asks again after this long (the
/// leader may have been upgraded since).
const REPROBE_AFTER: Duration = Duration::from_secs(30);
/// Requests queued for the connection.
const REQUEST_QUEUE: usize = 256;
/// HTTP/2 receive windows of a session's connection. Every partition's answers share one
/// stream, so its window is as large as a whole fetch response.
const STREAM_WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;

/// What the session knows of its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Opening,
    Open,
    /// The leader does not serve `FetchSession`: fetch with unary calls.
    Unary,
    /// The stream failed or the leader ended it; fetchers get a new session.
    Closed(String),
}

type Waiting = HashMap<u64, oneshot::Sender<ReplicaFetchResponse>>;

/// One follower's connection and fetch stream to one leader broker.
pub struct Session {
    address: String,
    client: ReplicaClient<Channel>,
    requests: mpsc::Sender<ReplicaFetchRequest>,
    /// Fetchers waiting for their answer, by tag; `None` once the stream is closed.
    waiting: Arc<Mutex<Option<Waiting>>>,
    state: watch::Receiver<State>,
    next_tag: AtomicU64,
    opened: Instant,
}

impl Session {
    fn open(
        address: String,
        tls: Option<&strata_proto::tls::GrpcTls>,
        max_message: usize,
    ) -> Result<Arc<Session>, String> {
        let endpoint = strata_proto::tls::live_endpoint(&address, tls)
            .map_err(|e| format!("leader's gRPC address {address} is invalid: {e}"))?
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW);
        let client =
            ReplicaClient::new(endpoint.connect_lazy()).max_decoding_message_size(max_message);
        let (requests, outbound) = mpsc::channel(REQUEST_QUEUE);
        let (state_tx, state) = watch::channel(State::Opening);
        let waiting = Arc::new(Mutex::new(Some(HashMap::new())));
        tokio::spawn(read_answers(
            address.clone(),
            client.clone(),
            outbound,
            Arc::downgrade(&waiting),
            state_tx,
        ));
        Ok(Arc::new(Session {
            address,
            client,
            requests,
            waiting,
            state,
            next_tag: AtomicU64::new(0),
            opened: Instant::now(),
        }))
    }

    /// The session's connection, for the other calls to this leader.
    pub fn client(&self) -> ReplicaClient<Channel> {
        self.client.clone()
    }

    /// Sends one fetch and waits for its answer. An error says why the session cannot
    /// carry it (the fetcher backs off and asks for a session again).
    pub async fn fetch(
        &self,
        mut request: ReplicaFetchRequest,
    ) -> Result<ReplicaFetchResponse, String> {
        let state = self
            .state
            .clone()
            .wait_for(|s| *s != State::Opening)
            .await
            .map(|s| s.clone())
            .unwrap_or_else(|_| State::Closed("the session's reader stopped".into()));
        match state {
            State::Opening => unreachable!("waited for the session to open"),
            State::Closed(why) => return Err(why),
            State::Unary => {
                return self
                    .client()
                    .fetch(request)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|e| format!("fetch failed: {}", e.message()))
            }
            State::Open => {}
        }
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        request.tag = tag;
        let (answer, wait) = oneshot::channel();
        match self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            Some(waiting) => waiting.insert(tag, answer),
            None => return Err("the fetch session closed".into()),
        };
        // An abandoned fetch (timed out, or its fetcher stopped) forgets its tag.
        let _forget = Forget {
            tag,
            waiting: &self.waiting,
        };
        if self.requests.send(request).await.is_err() {
            return Err("the fetch session closed".into());
        }
        wait.await.map_err(|_| {
            let state = self.state.borrow().clone();
            match state {
                State::Closed(why) => why,
                _ => "the fetch session closed".into(),
            }
        })
    }

    /// Whether fetchers should get a new session instead of this one.
    fn stale(&self, address: &str) -> bool {
        self.address != address
            || match &*self.state.borrow() {
                State::Closed(_) => true,
                State::Unary => self.opened.elapsed() >= REPROBE_AFTER,
                State::Opening | State::Open => false,
            }
    }
}

struct Forget<'a> {
    tag: u64,
    waiting: &'a Mutex<Option<Waiting>>,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if let Some(waiting) = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            waiting.remove(&self.tag);
        }
    }
}

/// Opens the stream, then hands each answer to the fetcher waiting for its tag, until the
/// stream ends. It ends when the leader closes it or the connection fails, and when the
/// session is dropped (its request sender goes, so the outbound stream ends and the leader
/// closes its side).
async fn read_answers(
    address: String,
    mut client: ReplicaClient<Channel>,
    outbound: mpsc::Receiver<ReplicaFetchRequest>,
    waiting: Weak<Mutex<Option<Waiting>>>,
    state: watch::Sender<State>,
) {
    let close = |why: String| {
        if let Some(waiting) = waiting.upgrade() {
            // dropping the senders wakes every fetcher still waiting
            waiting.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        state.send_replace(State::Closed(why));
    };
    let opened = tokio::time::timeout(
        OPEN_TIMEOUT,
        client.fetch_session(tokio_stream::wrappers::ReceiverStream::new(outbound)),
    )
    .await;
    let mut inbound = match opened {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
            tracing::info!(leader = %address, "the leader does not serve FetchSession (an older version?); fetching with unary calls");
            state.send_replace(State::Unary);
            return;
        }
        Ok(Err(s)) => return close(format!("opening the fetch session failed: {}", s.message())),
        Err(_) => return close("opening the fetch session timed out".into()),
    };
    state.send_replace(State::Open);
    loop {
        match inbound.message().await {
            Ok(Some(answer)) => {
                let Some(waiting) = waiting.upgrade() else {
                    return;
                };
                let to = waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_mut()
                    .and_then(|w| w.remove(&answer.tag));
                // (no one waiting: the fetch was abandoned)
                if let Some(to) = to {
                    let _ = to.send(answer);
                }
            }
            Ok(None) => return close("the leader ended the fetch session".into()),
            Err(e) => return close(format!("fetch failed: {}", e.message())),
        }
    }
}

/// This broker's fetch sessions, one per leader broker. Fetchers hold their session; the
/// registry keeps only a weak reference, so a session no fetcher uses closes.
#[derive(Default)]
pub struct Sessions {
    by_leader: Mutex<HashMap<i32, Weak<Session>>>,
}

impl Sessions {
    /// The session to `leader` at `address`, opened if there is none or the last one failed.
    pub fn get(
        &self,
        leader: i32,
        address: &str,
        tls: Option<&strata_proto::tls::GrpcTls>,
        max_message: usize,
    ) -> Result<Arc<Session>, String> {
        let mut by_leader = self.by_leader.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = by_leader.get(&leader).and_then(Weak::upgrade) {
            if !s.stale(address) {
                return Ok(s);
            }
        }
        let s = Session::open(address.to_string(), tls, max_message)?;
        by_leader.insert(leader, Arc::downgrade(&s));
        by_leader.retain(|_, s| s.strong_count() > 0);
        Ok(s)
    }
}
