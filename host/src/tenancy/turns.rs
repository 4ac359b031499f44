//! Fair turns on the host's CPU, the async half: a request waits for its turn on a oneshot
//! channel while [`super::turn_state`] decides who is next (see there for the policy).

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::TenancyError;
use super::turn_state::{Arrival, TurnState};
use crate::nn::host::CpuTurn;

/// How a waiting request is woken.
#[derive(Debug)]
enum Wake {
    Run,
    PushedOut,
    /// Its turn came with less of its deadline left than requests take now.
    TooLittleLeft {
        left: Duration,
        needed: Duration,
    },
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    wake: oneshot::Sender<Wake>,
    /// For a new request (none for one resuming after a model call or a time slice).
    start: Option<Start>,
}

/// What a new request's turn must leave it: its deadline, and how long its tenant's
/// requests take from start to end now.
#[derive(Debug, Clone, Copy)]
struct Start {
    deadline: Instant,
    needs: Duration,
}

/// The host's CPU turns, shared by every request.
pub struct Turns {
    state: Mutex<TurnState<Waiter>>,
    next_id: AtomicU64,
    /// While requests wait, how often one of them starts (a moving average, in nanoseconds):
    /// with the line ahead of a new request it predicts the request's wait. Starts, not every
    /// pass of a turn: the requests ahead also take turns to resume after their model calls
    /// and time slices, and counting those passes as starts predicted half the wait of an
    /// app that calls a model once, so past capacity requests were let in to expire in line.
    start_interval_ns: AtomicU64,
    last_start_ns: AtomicU64,
    /// Per tenant, how long a request takes from its start to its end (a moving average, in
    /// nanoseconds, its model calls and resumptions included): a new request must start early
    /// enough to finish, or past capacity requests start just before their deadline and spend
    /// the CPU of their work only to run out of time in it. Per tenant: one whose guests wait
    /// for seconds must not make another's requests look too slow to start.
    service_ns: Mutex<HashMap<Arc<str>, u64>>,
    origin: std::time::Instant,
}

impl Turns {
    /// `slots` turns (the CPUs the host works on); at most `max_waiting` requests wait.
    pub fn new(slots: usize, max_waiting: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(TurnState::new(slots, max_waiting)),
            next_id: AtomicU64::new(0),
            start_interval_ns: AtomicU64::new(0),
            last_start_ns: AtomicU64::new(0),
            service_ns: Mutex::default(),
            origin: std::time::Instant::now(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, TurnState<Waiter>> {
        // The state stays consistent across a panic elsewhere: every method finishes its update.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wait for a turn for a new request of `tenant`, until `deadline`. A request that would
    /// not start in time to finish before its deadline, at the rate waiting requests start
    /// and the time requests take now, is refused at once:
    /// past capacity, refusing fast is what keeps the admitted requests within their deadline.
    pub async fn enter(
        self: &Arc<Self>,
        tenant: Arc<str>,
        weight: u32,
        deadline: Instant,
    ) -> Result<Turn, TenancyError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (wake, woken) = oneshot::channel();
        let interval = Duration::from_nanos(self.start_interval_ns.load(Ordering::Relaxed));
        let service = self.service(&tenant);
        let budget = deadline.saturating_duration_since(Instant::now());
        let arrival = {
            let mut state = self.lock();
            let (ahead, over_share) = state.ahead_of(&tenant, weight);
            let predicted = interval.saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX)) + service;
            if ahead > 0 && predicted > budget.mul_f64(ADMIT_WITHIN) {
                drop(state);
                return Err(too_late(&tenant, over_share, predicted, budget));
            }
            state.arrive(&tenant, weight, Waiter { id, wake, start: Some(Start { deadline, needs: service }) })
        };
        match arrival {
            Arrival::Run => {
                let turn = Turn::held(self.clone(), tenant, weight);
                // Holding the turn, let the other requests that are ready to run reach the
                // line: the next turn then goes round robin among them instead of to whichever
                // the runtime happens to poll first (a burst of one tenant's requests would
                // otherwise start one after another ahead of a request that came with it).
                tokio::task::yield_now().await;
                return Ok(turn);
            }
            Arrival::Refused { over_share } => return Err(refused(&tenant, over_share)),
            Arrival::Wait => {}
            Arrival::WaitPushingOut(other) => {
                let _ = other.wake.send(Wake::PushedOut);
            }
        }
        let mut waiting = Waiting { turns: self, tenant: &tenant, id, woken, settled: false };
        let woke = tokio::time::timeout_at(deadline, &mut waiting.woken).await;
        match woke {
            Ok(Ok(Wake::Run)) => {
                waiting.settled = true;
                drop(waiting);
                let turn = Turn::held(self.clone(), tenant, weight);
                let_the_network_in().await;
                Ok(turn)
            }
            Ok(Ok(Wake::PushedOut)) => {
                waiting.settled = true;
                Err(refused(&tenant, true))
            }
            Ok(Ok(Wake::TooLittleLeft { left, needed })) => {
                waiting.settled = true;
                Err(TenancyError::TooLittleLeft { left, needed })
            }
            Ok(Err(_)) => {
                waiting.settled = true;
                Err(TenancyError::TurnLost)
            }
            Err(_elapsed) => Err(TenancyError::DeadlineWaiting),
        }
    }

    /// Give a turn back, passing it to the next waiter still there. A new request whose turn
    /// comes with less of its deadline left than its tenant's requests take now is refused
    /// instead: it would spend the CPU of its work only to run out of time in it (past
    /// capacity, such starts crowd out the requests that could still finish, and they finish
    /// fast, so the rate of starts would look higher than the rate of work).
    fn release(&self) {
        loop {
            let Some(next) = self.lock().release() else { return };
            let wake = match next.start {
                Some(Start { deadline, needs }) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left < needs { Wake::TooLittleLeft { left, needed: needs } } else { Wake::Run }
                }
                None => Wake::Run,
            };
            let runs = matches!(wake, Wake::Run);
            if next.wake.send(wake).is_ok() && runs {
                if next.start.is_some() {
                    self.started();
                }
                return;
            }
            // That waiter's request has gone, or was refused: pass the turn on.
        }
    }

    /// A turn passed to a waiting new request: fold the time since the last such start into
    /// the average (gaps of a second or more are idle time, not the rate of work).
    fn started(&self) {
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let last = self.last_start_ns.swap(now, Ordering::Relaxed);
        let interval = now.saturating_sub(last);
        if last == 0 || interval >= 1_000_000_000 {
            return;
        }
        let average = self.start_interval_ns.load(Ordering::Relaxed);
        self.start_interval_ns.store(folded(average, interval, START_AVERAGE), Ordering::Relaxed);
    }

    /// How long `tenant`'s requests take from start to end lately (zero before the first).
    fn service(&self, tenant: &Arc<str>) -> Duration {
        let services = self.service_ns.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Duration::from_nanos(services.get(tenant).copied().unwrap_or(0))
    }

    /// A request of `tenant` ended `took` after it started.
    fn served(&self, tenant: &Arc<str>, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let mut services = self.service_ns.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let average = services.entry(tenant.clone()).or_insert(0);
        *average = folded(*average, took, SERVICE_AVERAGE);
    }
}

/// A new request waits in line only when it would finish within this share of its remaining
/// time, as predicted. Past capacity most admitted requests are admitted near the limit, and
/// the rate of starts swings with the machine (2x within minutes on shared hosts): with the
/// limit at the deadline, every turn that came later than predicted was a failure after a
/// wait (a 504, or a refusal a second late). Half leaves room for such swings; a longer
/// line keeps the CPU no busier, it only adds latency.
const ADMIT_WITHIN: f64 = 0.5;

/// How many of the latest starts the interval between starts is averaged over: one interval
/// varies a lot (bursts of arrivals, resumptions between starts), and a new request's wait
/// is many intervals long; an average of a few noisy ones let in requests its turn came too
/// late for.
const START_AVERAGE: u64 = 128;
/// How many of the latest requests their time from start to end is averaged over.
const SERVICE_AVERAGE: u64 = 16;

/// A moving average over about the latest `over` samples, with `sample` folded in.
fn folded(average: u64, sample: u64, over: u64) -> u64 {
    if average == 0 { sample } else { average - average / over + sample / over }
}

/// A request refused because the line ahead of it would outlast its deadline.
fn too_late(tenant: &str, over_share: bool, predicted: Duration, budget: Duration) -> TenancyError {
    TenancyError::WaitTooLong { tenant: over_share.then(|| tenant.to_string()), predicted, budget }
}

fn refused(tenant: &str, over_share: bool) -> TenancyError {
    TenancyError::LineFull { tenant: over_share.then(|| tenant.to_string()) }
}

/// A request's place in line; dropped before its wake-up, it leaves the line, and a turn
/// handed to it in the meantime is passed on.
struct Waiting<'a> {
    turns: &'a Arc<Turns>,
    tenant: &'a Arc<str>,
    id: u64,
    woken: oneshot::Receiver<Wake>,
    settled: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let id = self.id;
        let removed = self.turns.lock().remove(self.tenant, |waiter| waiter.id == id);
        if !removed && matches!(self.woken.try_recv(), Ok(Wake::Run)) {
            self.turns.release();
        }
    }
}

/// A request's hold on a turn; dropping it gives the turn back.
pub struct Turn {
    turns: Arc<Turns>,
    /// The request's tenant and weight, for the line it resumes in.
    tenant: Arc<str>,
    weight: u32,
    /// Shared with a time slice's wait (see [`Turn::end_slice`]), which sets it when the
    /// turn comes back.
    holding: Arc<Holding>,
}

/// Whether a request holds its turn now, and how long it has held one in all: the CPU time
/// it took outside models (its guest, and the host's work on it), which its cost counts.
#[derive(Debug)]
pub struct Holding {
    held: AtomicBool,
    /// When the current hold began, in nanoseconds since `epoch`.
    since: AtomicU64,
    /// Nanoseconds of the holds that ended.
    total: AtomicU64,
    epoch: std::time::Instant,
}

impl Holding {
    fn held_now() -> Self {
        Self {
            held: AtomicBool::new(true),
            since: AtomicU64::new(0),
            total: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        }
    }

    fn nanos(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// The turn came back (or did not, if `held` is false).
    fn set(&self, held: bool) {
        if held {
            self.since.store(self.nanos(), Ordering::Relaxed);
        }
        self.held.store(held, Ordering::Release);
    }

    /// Let the turn go; whether it was held.
    fn release(&self) -> bool {
        let was_held = self.held.swap(false, Ordering::AcqRel);
        if was_held {
            let held_for = self.nanos().saturating_sub(self.since.load(Ordering::Relaxed));
            self.total.fetch_add(held_for, Ordering::Relaxed);
        }
        was_held
    }

    /// How long the request has held a turn, the current hold included.
    pub fn held_for(&self) -> Duration {
        let current = match self.is_held() {
            true => self.nanos().saturating_sub(self.since.load(Ordering::Relaxed)),
            false => 0,
        };
        Duration::from_nanos(self.total.load(Ordering::Relaxed) + current)
    }
}

impl Turn {
    fn held(turns: Arc<Turns>, tenant: Arc<str>, weight: u32) -> Self {
        Self { turns, tenant, weight, holding: Arc::new(Holding::held_now()) }
    }

    /// How long the request holds and has held a turn, readable after the turn is handed on.
    pub fn holding(&self) -> Arc<Holding> {
        self.holding.clone()
    }

    /// Whether the request holds a turn now.
    pub fn is_held(&self) -> bool {
        self.holding.is_held()
    }

    /// Give the turn up while the request waits for something else (a model, a timer).
    pub fn pause(&mut self) {
        if self.holding.release() {
            self.turns.release();
        }
    }

    /// Take a turn again after [`Turn::pause`], ahead of the tenant's requests waiting to
    /// start, in round robin with other tenants.
    pub async fn resume(&mut self) {
        if self.is_held() {
            return;
        }
        wait_to_resume(self.turns.clone(), self.tenant.clone(), self.weight, self.holding.clone()).await;
    }

    /// End a guest's time slice: when other requests wait for a turn, give this one up and
    /// return the wait for it to come back (in the tenant's lane, in round robin with the
    /// others); `None` when nobody waits and the guest keeps its turn.
    pub fn end_slice(&mut self) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
        if !self.is_held() || !self.turns.lock().anyone_waiting() {
            return None;
        }
        self.pause();
        Some(Box::pin(wait_to_resume(self.turns.clone(), self.tenant.clone(), self.weight, self.holding.clone())))
    }
}

/// Wait for a turn in `tenant`'s resumption lane; `holding` is set once it is held.
async fn wait_to_resume(turns: Arc<Turns>, tenant: Arc<str>, weight: u32, holding: Arc<Holding>) {
    let id = turns.next_id.fetch_add(1, Ordering::Relaxed);
    let (wake, woken) = oneshot::channel();
    if turns.lock().resume(&tenant, weight, Waiter { id, wake, start: None }) {
        holding.set(true);
        return;
    }
    let mut waiting = Waiting { turns: &turns, tenant: &tenant, id, woken, settled: false };
    let woke = (&mut waiting.woken).await;
    waiting.settled = true;
    let held = matches!(woke, Ok(Wake::Run));
    holding.set(held);
    if held {
        let_the_network_in().await;
    }
}

/// How long a runtime thread may run turns handed from one request to the next before it
/// looks at the network (see [`let_the_network_in`]).
const LOOK_AT_THE_NETWORK_EVERY: Duration = Duration::from_millis(2);

thread_local! {
    /// When requests run on this thread last let the network in.
    static NETWORK_LET_IN: Cell<Option<std::time::Instant>> = const { Cell::new(None) };
}

/// A request given a turn it waited for: before its work, let the requests that have arrived
/// meanwhile be read, if this thread has not done so for [`LOOK_AT_THE_NETWORK_EVERY`].
///
/// While every turn is busy the runtime thread is never idle, and it looks for network
/// events only every 61 tasks (tokio's event interval); a turn handed on wakes the next
/// request to run right after the one that handed it (tokio's LIFO slot), so the waiting
/// requests' work ran back to back while a new request (past capacity most often one to
/// refuse, or a light tenant's) sat unread in its socket: refusals took 14–25 ms (p99) at
/// 2x–5x capacity, ~4 ms with this. A yielded task runs again only after the runtime has run
/// its other ready tasks and polled for network events. At most every 2 ms: a yield at every
/// such turn spaced out the requests reaching a model and shrank its batches (closed-loop
/// throughput halved, BENCHMARKS.md).
async fn let_the_network_in() {
    let now = std::time::Instant::now();
    let due = NETWORK_LET_IN.with(|last| match last.get() {
        Some(at) if now.saturating_duration_since(at) < LOOK_AT_THE_NETWORK_EVERY => false,
        _ => {
            last.set(Some(now));
            true
        }
    });
    if due {
        tokio::task::yield_now().await;
    }
}

impl CpuTurn for Turn {
    fn pause(&mut self) {
        Turn::pause(self);
    }

    fn resume(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(Turn::resume(self))
    }

    fn end_slice(&mut self) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
        Turn::end_slice(self)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.pause();
        self.turns.served(&self.tenant, self.holding.epoch.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// A request of `tenant` waiting for its turn in a task of its own; it ends as it gets it.
    fn enter_later(
        turns: &Arc<Turns>,
        tenant: &'static str,
        deadline: Instant,
    ) -> tokio::task::JoinHandle<Result<(), TenancyError>> {
        let turns = turns.clone();
        tokio::spawn(async move { turns.enter(tenant.into(), 1, deadline).await.map(drop) })
    }

    /// [`enter_later`], noting `label` in `order` when the wait ends.
    fn enter_later_noting(
        turns: &Arc<Turns>,
        tenant: &'static str,
        order: &Arc<Mutex<Vec<&'static str>>>,
        label: &'static str,
    ) -> tokio::task::JoinHandle<Result<(), TenancyError>> {
        let (turns, order) = (turns.clone(), order.clone());
        tokio::spawn(async move {
            let turn = turns.enter(tenant.into(), 1, far()).await;
            order.lock().expect("order lock").push(label);
            turn.map(drop)
        })
    }

    #[tokio::test]
    async fn a_released_turn_goes_to_the_next_waiter() {
        let turns = Turns::new(1, 8);
        let first = turns.enter("a".into(), 1, far()).await.expect("a free turn");
        let waiting = enter_later(&turns, "b", far());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "b waits while a holds the only turn");
        drop(first);
        waiting.await.expect("joined").expect("b runs after a");
        assert_eq!(turns.lock().busy(), 0, "b's turn was given back when it ended");
    }

    /// Past capacity a turn handed on wakes the next request to run right after the request
    /// that handed it (tokio's LIFO slot); a task that was ready before (here one standing for
    /// a connection with a request to read, most often to refuse) would wait behind it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_request_given_a_turn_it_waited_for_lets_work_ready_before_it_run_first() {
        let turns = Turns::new(1, 8);
        let order = Arc::new(Mutex::new(Vec::new()));
        let held = turns.enter("a".into(), 1, far()).await.expect("a free turn");
        let waiter = enter_later_noting(&turns, "b", &order, "b starts");
        while turns.lock().waiting() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // On the runtime's one worker, as a request ending there hands its turn on.
        tokio::spawn({
            let order = order.clone();
            async move {
                tokio::spawn(async move { order.lock().expect("order lock").push("ready work") });
                drop(held);
            }
        })
        .await
        .expect("joined");
        waiter.await.expect("joined").expect("b's turn");
        assert_eq!(*order.lock().expect("order lock"), ["ready work", "b starts"]);
    }

    #[tokio::test]
    async fn a_waiter_past_its_deadline_leaves_the_line() {
        let turns = Turns::new(1, 8);
        let _held = turns.enter("a".into(), 1, far()).await.expect("a free turn");
        let error = turns
            .enter("b".into(), 1, Instant::now() + Duration::from_millis(10))
            .await
            .err()
            .expect("b times out waiting");
        assert_eq!(error, TenancyError::DeadlineWaiting);
        assert_eq!(turns.lock().waiting(), 0);
    }

    #[tokio::test]
    async fn a_paused_turn_lets_another_request_run_and_resumes_before_its_tenants_new_ones() {
        let turns = Turns::new(1, 8);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut first = turns.enter("a".into(), 1, far()).await.expect("a free turn");
        first.pause();
        let other = turns.enter("b".into(), 1, far()).await.expect("a's paused turn is free");
        let newer = enter_later_noting(&turns, "a", &order, "new");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let resumed = tokio::spawn({
            let order = order.clone();
            async move {
                first.resume().await;
                order.lock().expect("order lock").push("resumed");
                first.is_held()
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(other);
        assert!(resumed.await.expect("joined"), "the first request holds a turn again");
        newer.await.expect("joined").expect("the newer request runs once the first is done");
        assert_eq!(*order.lock().expect("order lock"), ["resumed", "new"]);
    }

    #[tokio::test]
    async fn a_time_slice_ends_only_when_someone_waits_and_the_turn_comes_back_after_them() {
        let turns = Turns::new(1, 8);
        let mut spinner = turns.enter("a".into(), 1, far()).await.expect("a free turn");
        assert!(spinner.end_slice().is_none(), "nobody waits: the guest keeps its turn");
        assert!(spinner.is_held());
        let other = tokio::spawn({
            let turns = turns.clone();
            async move {
                let turn = turns.enter("b".into(), 1, far()).await.expect("b's turn");
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(turn);
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let wait = spinner.end_slice().expect("b waits: a's slice ends");
        assert!(!spinner.is_held(), "a gave its turn to b");
        let started = std::time::Instant::now();
        wait.await;
        assert!(spinner.is_held(), "a holds a turn again once b is done");
        assert!(started.elapsed() >= Duration::from_millis(15), "a waited for b's work");
        other.await.expect("joined");
        drop(spinner);
        assert_eq!(turns.lock().busy(), 0);
    }

    #[tokio::test]
    async fn a_request_that_would_wait_past_its_deadline_is_refused_at_once() {
        let turns = Turns::new(1, 64);
        let _held = turns.enter("a".into(), 1, far()).await.expect("a free turn");
        let waiting: Vec<_> = (0..5).map(|_| enter_later(&turns, "a", far())).collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Requests start every 100 ms: b is second in line (one of a's goes first), a's sixth.
        turns.start_interval_ns.store(100_000_000, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let soon = Instant::now() + Duration::from_millis(150);
        let refused = turns.enter("a".into(), 1, soon).await.err().expect("500 ms of line, 150 ms of deadline");
        assert!(started.elapsed() < Duration::from_millis(20), "refused at once");
        assert!(matches!(refused, TenancyError::WaitTooLong { tenant: None, .. }), "{refused}");
        assert!(refused.to_string().contains("would take about 500 ms"), "{refused}");
        let b = enter_later(&turns, "b", Instant::now() + Duration::from_millis(250));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!b.is_finished(), "b's wait fits half its deadline: it waits");
        drop(waiting);
    }

    #[tokio::test]
    async fn a_heavy_tenant_is_pushed_out_for_a_light_one() {
        let turns = Turns::new(1, 2);
        let held = turns.enter("a".into(), 1, far()).await.expect("a free turn");
        let heavy: Vec<_> = (0..2).map(|_| enter_later(&turns, "a", far())).collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let refused = turns.enter("a".into(), 1, far()).await.err().expect("a's third waiter is refused");
        assert_eq!(refused, TenancyError::LineFull { tenant: None }, "only one tenant waits: the server is full");
        let light = enter_later(&turns, "b", far());
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        let mut kinds = Vec::new();
        for task in heavy {
            if let Err(error) = task.await.expect("joined") {
                kinds.push(error);
            }
        }
        let pushed_out = TenancyError::LineFull { tenant: Some("a".to_string()) };
        assert_eq!(kinds, vec![pushed_out], "a's newest waiter made room for b");
        light.await.expect("joined").expect("b runs");
    }

    #[tokio::test]
    async fn a_request_whose_turn_comes_too_late_to_finish_is_refused_and_the_turn_passes_on() {
        let turns = Turns::new(1, 64);
        let held = turns.enter("a".into(), 1, far()).await.expect("a free turn");
        turns.service_ns.lock().expect("services").insert("a".into(), 50_000_000);
        let soon = Instant::now() + Duration::from_millis(70);
        let late = enter_later(&turns, "a", soon);
        let next = enter_later(&turns, "a", far());
        tokio::time::sleep(Duration::from_millis(30)).await;
        // Requests take 50 ms; 40 ms of the first waiter's deadline is left when its turn
        // comes: too little to finish, so it is refused, not started.
        drop(held);
        let refused = late.await.expect("joined").expect_err("its turn came too late");
        assert!(matches!(refused, TenancyError::TooLittleLeft { .. }), "{refused}");
        assert!(refused.to_string().contains("requests take about 50 ms"), "{refused}");
        next.await.expect("joined").expect("the turn passed on to the next waiter");
        assert_eq!(turns.lock().busy(), 0);
    }

    #[tokio::test]
    async fn the_wait_is_predicted_from_how_often_new_requests_start_not_from_resumptions() {
        let turns = Turns::new(1, 64);
        let mut first = turns.enter("a".into(), 1, far()).await.expect("a free turn");
        let second = tokio::spawn({
            let turns = turns.clone();
            async move {
                let turn = turns.enter("a".into(), 1, far()).await.expect("its turn");
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(turn);
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The first request calls a model: its turn starts the second, then it resumes.
        first.pause();
        first.resume().await;
        second.await.expect("joined");
        drop(first);
        assert_eq!(turns.start_interval_ns.load(Ordering::Relaxed), 0, "one start: no interval between starts yet");
        assert!(turns.service(&"a".into()) >= Duration::from_millis(10), "requests took 10 ms or more");
    }

    #[tokio::test]
    async fn a_tenant_whose_requests_take_long_does_not_make_anothers_look_too_slow_to_start() {
        let turns = Turns::new(1, 64);
        // The slow tenant's requests wait in host calls for ten seconds each.
        turns.service_ns.lock().expect("services").insert("slow".into(), 10_000_000_000);
        let held = turns.enter("slow".into(), 1, far()).await.expect("a free turn");
        let slow = enter_later(&turns, "slow", far());
        tokio::time::sleep(Duration::from_millis(20)).await;
        turns.start_interval_ns.store(10_000_000, Ordering::Relaxed);
        let quick = enter_later(&turns, "a", Instant::now() + Duration::from_millis(200));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!quick.is_finished(), "a's request waits: its own requests are quick");
        drop(held);
        quick.await.expect("joined").expect("a's request starts");
        let refused = slow.await.expect("joined").expect_err("5 s left of the 10 s its requests take");
        assert!(matches!(refused, TenancyError::TooLittleLeft { .. }), "only the slow tenant's own request: {refused}");
    }
}
