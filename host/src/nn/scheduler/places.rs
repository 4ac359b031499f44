//! Each tenant's share of a device's runs across every model's queue: the host's shared
//! cores, and each GPU. A queue shares one model's batches fairly between tenants, but
//! different models share no queue: each busy model ran its batches on a thread of its own and
//! the OS shares cores per thread, so a tenant with sixteen busy heavy models had sixteen
//! threads on two cores beside another tenant's one (that tenant's p99 1.2 -> 29 ms:
//! BENCHMARKS.md, heavy models beside a light one). A GPU runs what its callers give it, in
//! turn, just as blindly.
//!
//! So an engine run on a shared device holds a place of that device's gate. While fewer places
//! are held than the gate has, any run takes one; beyond that, a run takes one only while one
//! of its tenants holds fewer than its weighted share of the places (`compute_weight` over the
//! weights of tenants with runs held or waiting; at least one, so a tenant's first run never
//! waits for another tenant's), and otherwise waits. A freed place goes to a waiter under its
//! share first, else, while places are free, to the waiter whose tenant holds the fewest for
//! its weight; among equals, to the tenant least recently given a place, then the oldest.
//! Runs that go on are never stopped: one that enters under its share shares the device with
//! what is left of the others', and the next runs of tenants over their share wait. A tenant
//! alone uses every place. A device whose engine must run one run at a time (ONNX Runtime's
//! WebGPU provider) has one place and no more: a run waits for the one going on, and the next
//! place goes by the same order, so tenants take turns there.
//!
//! In: a run's device, its tenants with their weights, and the run. Out: a [`Place`], held
//! while the run lasts; a run that must wait is run by the thread that frees a place. Imports
//! the metrics and device names only.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use crate::registry::placement::DeviceId;
use crate::telemetry::metrics::metrics;

/// The tenants of one run (each once) with their compute weights.
pub type Runners = Vec<(Arc<str>, u32)>;

/// One tenant's runs: holding places, and waiting for one.
#[derive(Debug)]
struct Holding {
    held: usize,
    waiting: usize,
    weight: u32,
    /// When one of its runs last took a place (the gate's count of places taken); 0: none
    /// since it came.
    last_turn: u64,
}

/// The places' state: a plain struct, driven under the lock of [`DeviceGate`].
#[derive(Debug)]
pub struct Places<W> {
    capacity: usize,
    /// No run beyond the capacity, whatever its tenants' share: the device runs so many at
    /// once or fails.
    hard: bool,
    held: usize,
    /// Places taken so far.
    turns: u64,
    /// Tenants with runs held or waiting.
    tenants: HashMap<Arc<str>, Holding>,
    /// The sum of those tenants' weights.
    weight: u64,
    /// Runs waiting, oldest first, with what wakes each.
    waiting: VecDeque<(u64, Runners, W)>,
}

impl<W> Places<W> {
    pub fn new(capacity: usize) -> Self {
        let waiting = VecDeque::new();
        Self { capacity: capacity.max(1), hard: false, held: 0, turns: 0, tenants: HashMap::new(), weight: 0, waiting }
    }

    /// One run at a time, whatever the tenants' shares; the next place goes to the waiter
    /// under its share first, as any freed place does.
    pub fn one_at_a_time() -> Self {
        Self { hard: true, ..Self::new(1) }
    }

    /// Places held now, by runs of any tenant.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Places `tenant`'s runs hold.
    pub fn held_by(&self, tenant: &str) -> usize {
        self.tenants.get(tenant).map_or(0, |holding| holding.held)
    }

    /// The places `tenant`'s weight gives it among the tenants with runs held or waiting.
    fn share(&self, holding: &Holding) -> usize {
        let share = self.capacity as u64 * u64::from(holding.weight) / self.weight.max(1);
        usize::try_from(share).unwrap_or(usize::MAX).max(1)
    }

    fn under_share(&self, runners: &Runners) -> bool {
        runners
            .iter()
            .filter_map(|(tenant, _)| self.tenants.get(tenant))
            .any(|holding| holding.held < self.share(holding))
    }

    /// How many places the neediest of a run's tenants holds for its weight, and when the one
    /// least recently given a place last was: the lower goes first.
    fn need(&self, runners: &Runners) -> (f64, u64) {
        let holdings = || runners.iter().filter_map(|(tenant, _)| self.tenants.get(tenant));
        let held_per_weight = |holding: &Holding| holding.held as f64 / f64::from(holding.weight.max(1));
        let held = holdings().map(held_per_weight).fold(f64::MAX, f64::min);
        (held, holdings().map(|holding| holding.last_turn).min().unwrap_or(0))
    }

    fn join(&mut self, runners: &Runners) {
        for (tenant, weight) in runners {
            let weight = (*weight).max(1);
            if !self.tenants.contains_key(tenant) {
                self.tenants.insert(tenant.clone(), Holding { held: 0, waiting: 0, weight, last_turn: 0 });
                self.weight += u64::from(weight);
            }
        }
    }

    /// Forget tenants with nothing held or waiting: their weight no longer counts.
    fn part(&mut self, runners: &Runners) {
        for (tenant, _) in runners {
            if let Some(holding) = self.tenants.get(tenant).filter(|h| h.held == 0 && h.waiting == 0) {
                self.weight -= u64::from(holding.weight);
                self.tenants.remove(tenant);
            }
        }
    }

    fn count(&mut self, runners: &Runners, held: isize, waiting: isize) {
        if held > 0 {
            self.turns += 1;
        }
        for (tenant, _) in runners {
            if let Some(holding) = self.tenants.get_mut(tenant) {
                holding.held = holding.held.saturating_add_signed(held);
                holding.waiting = holding.waiting.saturating_add_signed(waiting);
                if held > 0 {
                    holding.last_turn = self.turns;
                }
            }
        }
        self.held = self.held.saturating_add_signed(held);
    }

    /// A run asks for a place: whether it took one (if not, nothing changed).
    pub fn enter(&mut self, runners: &Runners) -> bool {
        self.join(runners);
        let enters = self.held < self.capacity || (!self.hard && self.under_share(runners));
        match enters {
            true => self.count(runners, 1, 0),
            false => self.part(runners),
        }
        enters
    }

    /// A run that could not enter waits, as `waiter` (`id`: its own, to give up by).
    pub fn wait(&mut self, id: u64, runners: Runners, waiter: W) {
        self.join(&runners);
        self.count(&runners, 0, 1);
        self.waiting.push_back((id, runners, waiter));
    }

    /// A run's place is free: the waiting runs that take places now, with their waiters.
    pub fn leave(&mut self, runners: &Runners) -> Vec<(Runners, W)> {
        self.count(runners, -1, 0);
        self.part(runners);
        self.admit()
    }

    /// A waiting run's deadline passed: `None` if it had been given a place meanwhile, else
    /// it, and the runs that take places now (its tenants' weight may no longer count).
    #[allow(clippy::type_complexity)]
    pub fn give_up(&mut self, id: u64) -> Option<(Runners, W, Vec<(Runners, W)>)> {
        let at = self.waiting.iter().position(|(waiting, ..)| *waiting == id)?;
        let (_, runners, waiter) = self.waiting.remove(at)?;
        self.count(&runners, 0, -1);
        self.part(&runners);
        Some((runners, waiter, self.admit()))
    }

    /// Where the neediest of the waiters `eligible` lies: fewest places held for its weight,
    /// then least recently given one (so tenants take turns on a device of one place), then
    /// the oldest.
    fn neediest(&self, eligible: impl Fn(&Runners) -> bool) -> Option<usize> {
        let needs = self.waiting.iter().enumerate().filter(|(_, (_, runners, _))| eligible(runners));
        let needs = needs.map(|(at, (_, runners, _))| (at, self.need(runners)));
        let least = needs.min_by(|(a_at, (a_held, a_turn)), (b_at, (b_held, b_turn))| {
            a_held.total_cmp(b_held).then(a_turn.cmp(b_turn)).then(a_at.cmp(b_at))
        });
        least.map(|(at, _)| at)
    }

    fn admit(&mut self) -> Vec<(Runners, W)> {
        let mut admitted = Vec::new();
        loop {
            let free = self.held < self.capacity;
            let under_share = |runners: &Runners| self.under_share(runners);
            // Waiters under their share while any may enter, else any waiter while a place is free.
            let next = match (free || !self.hard).then(|| self.neediest(under_share)).flatten() {
                None if free => self.neediest(|_| true),
                next => next,
            };
            let Some((_, runners, waiter)) = next.and_then(|at| self.waiting.remove(at)) else { break };
            self.count(&runners, 1, -1);
            admitted.push((runners, waiter));
        }
        admitted
    }
}

/// A run waiting for a place. The thread whose run gives a place back runs the waiter it goes
/// to, next: no thread waits for a place, and no wake-up lies between one run's end and the
/// next's start (a hand-off through the waiter's task and a new blocking thread left one
/// tenant's runs on eight models 7-19% short of two cores).
pub trait Seated: Send {
    /// Run on `place`, on the thread that called; returns the runs it gave places to as it gave
    /// `place` back, for this thread to run next.
    fn run(self: Box<Self>, place: Place) -> Vec<Admitted>;

    /// Its deadline passed before it was given a place: answer it so.
    fn unseated(self: Box<Self>);
}

/// A waiting run, with the place it was given.
pub type Admitted = (Box<dyn Seated>, Place);

/// Run `admitted` on this thread, then each run it gives a place to; more admitted at once
/// than the first go to blocking threads of their own.
pub fn run_admitted(admitted: Vec<Admitted>) {
    let mut next = admitted;
    while !next.is_empty() {
        let (seat, place) = next.remove(0);
        spawn_admitted(std::mem::take(&mut next));
        next = seat.run(place);
    }
}

/// Run each of `admitted` on a blocking thread of its own (on this thread where there is no
/// runtime).
fn spawn_admitted(admitted: Vec<Admitted>) {
    for run in admitted {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || run_admitted(vec![run]))),
            Err(_) => run_admitted(vec![run]),
        }
    }
}

/// A waiting run and when it began to wait.
struct Waiter {
    seat: Box<dyn Seated>,
    since: std::time::Instant,
}

/// One shared device's places (the host's cores, a GPU), taken by every run of every model
/// there.
pub struct DeviceGate {
    /// Its name, as metrics label it.
    device: Arc<str>,
    places: Mutex<Places<Waiter>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for DeviceGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceGate")
            .field("device", &self.device)
            .field("capacity", &self.lock().capacity)
            .finish_non_exhaustive()
    }
}

/// A run's place on a device. Given back by [`Place::give_back`] (the runs it goes to are
/// the caller's to run) or when dropped (they go to blocking threads).
pub struct Place {
    gate: Option<Arc<DeviceGate>>,
    runners: Runners,
}

impl Place {
    /// Give it back: the waiting runs it went to, with their places, for the caller to run.
    pub fn give_back(mut self) -> Vec<Admitted> {
        self.gate.take().map_or_else(Vec::new, |gate| gate.leave(&self.runners))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            spawn_admitted(gate.leave(&self.runners));
        }
    }
}

/// Whether a run took a place at once or waits for one.
pub enum Entry {
    Taken(Admitted),
    /// It waits; give it up by this id.
    Waits(u64),
}

impl DeviceGate {
    /// Places for `capacity` runs at once on `device` (more while tenants under their share
    /// come in).
    pub fn new(device: DeviceId, capacity: usize) -> Arc<Self> {
        Self::of_places(device, Places::new(capacity))
    }

    /// One run at a time on `device` (see [`Places::one_at_a_time`]).
    pub fn one_at_a_time(device: DeviceId) -> Arc<Self> {
        Self::of_places(device, Places::one_at_a_time())
    }

    fn of_places(device: DeviceId, places: Places<Waiter>) -> Arc<Self> {
        Arc::new(Self { device: device.label().into(), places: Mutex::new(places), next_id: Default::default() })
    }

    fn lock(&self) -> MutexGuard<'_, Places<Waiter>> {
        self.places.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Places held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.lock().held()
    }

    fn place(self: &Arc<Self>, runners: Runners) -> Place {
        Place { gate: Some(self.clone()), runners }
    }

    /// A place for a run of `runners` if one may be had now (an instance's thread going on to
    /// its next batch, which must not wait).
    pub fn try_enter(self: &Arc<Self>, runners: Runners) -> Result<Place, Runners> {
        let mut places = self.lock();
        if !places.enter(&runners) {
            return Err(runners);
        }
        self.show(&places, [&runners]);
        Ok(self.place(runners))
    }

    /// `seat`, a run of `runners`, takes a place now, or waits for one: the thread that gives
    /// one to it runs it.
    pub fn enter(self: &Arc<Self>, runners: Runners, seat: Box<dyn Seated>) -> Entry {
        let mut places = self.lock();
        if places.enter(&runners) {
            self.show(&places, [&runners]);
            return Entry::Taken((seat, self.place(runners)));
        }
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        places.wait(id, runners, Waiter { seat, since: std::time::Instant::now() });
        Entry::Waits(id)
    }

    /// A waiting run's deadline passed: it, unless it was given a place meanwhile (then it
    /// runs, or ran, as any other).
    pub fn give_up(self: &Arc<Self>, id: u64) -> Option<Box<dyn Seated>> {
        let mut places = self.lock();
        let (runners, waiter, admitted) = places.give_up(id)?;
        self.charge_wait(&runners, waiter.since);
        let admitted = self.admitted(&places, admitted);
        drop(places);
        spawn_admitted(admitted);
        Some(waiter.seat)
    }

    fn leave(self: &Arc<Self>, runners: &Runners) -> Vec<Admitted> {
        let mut places = self.lock();
        let admitted = places.leave(runners);
        self.show(&places, [runners]);
        self.admitted(&places, admitted)
    }

    /// Runs given places: their waits charged, their gauges shown.
    fn admitted(self: &Arc<Self>, places: &Places<Waiter>, admitted: Vec<(Runners, Waiter)>) -> Vec<Admitted> {
        self.show(places, admitted.iter().map(|(runners, _)| runners));
        let admitted = admitted.into_iter().map(|(runners, waiter)| {
            self.charge_wait(&runners, waiter.since);
            (waiter.seat, self.place(runners))
        });
        admitted.collect()
    }

    /// The time a run waited, to each of its tenants.
    fn charge_wait(&self, runners: &Runners, since: std::time::Instant) {
        for (tenant, _) in runners {
            metrics().run_wait(tenant, &self.device, since.elapsed());
        }
    }

    /// The places the tenants of `runs` hold, in their gauges (under the lock, so each is the
    /// latest).
    fn show<'a, W>(&self, places: &Places<W>, runs: impl IntoIterator<Item = &'a Runners>) {
        for (tenant, _) in runs.into_iter().flatten() {
            metrics().engine_runs(tenant, &self.device, places.held_by(tenant));
        }
    }
}

/// The server's gates: the host's shared cores', and each GPU's, made as its first run comes.
#[derive(Debug)]
pub struct DeviceGates {
    cpu: Arc<DeviceGate>,
    /// The places of a GPU's gate.
    gpu_places: usize,
    gpus: Mutex<HashMap<DeviceId, Arc<DeviceGate>>>,
}

impl DeviceGates {
    /// Gates of `cpu_places` runs on the host's cores and `gpu_places` on each GPU.
    pub fn new(cpu_places: usize, gpu_places: usize) -> Arc<Self> {
        let cpu = DeviceGate::new(DeviceId::Cpu, cpu_places);
        Arc::new(Self { cpu, gpu_places, gpus: Mutex::default() })
    }

    /// The gate of runs on `device`; one run at a time there where `alone` (its engine's runs
    /// must not go on at once: see `Graph::runs_alone`).
    pub fn of(&self, device: DeviceId, alone: bool) -> Arc<DeviceGate> {
        if device == DeviceId::Cpu {
            return self.cpu.clone();
        }
        let mut gpus = self.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        let gate = || match alone {
            true => DeviceGate::one_at_a_time(device),
            false => DeviceGate::new(device, self.gpu_places),
        };
        gpus.entry(device).or_insert_with(gate).clone()
    }
}

/// The server's gates, once it has set them ([`serve_places`]); none in a process that serves
/// nothing (tests of the scheduler alone give their queues their own).
pub fn process_gates() -> Option<Arc<DeviceGates>> {
    PROCESS_GATES.get().cloned()
}

static PROCESS_GATES: OnceLock<Arc<DeviceGates>> = OnceLock::new();

/// Set the server's gates: `cores` cores, each run taking `threads_per_run` of them (its
/// engine's intra-op threads; 0, the engine's choice, is every core), and `gpu_runs` places on
/// each GPU. One run more than the cores hold: a run that takes a place starts on a thread
/// that must first wake, and with exactly as many runs as cores a core idled meanwhile (10-13%
/// of the CPU with another tenant's runs coming and going; `cargo bench --bench layers --
/// cores`).
pub fn serve_places(cores: usize, threads_per_run: usize, gpu_runs: usize) {
    let _ = PROCESS_GATES.set(DeviceGates::new(places_for(cores, threads_per_run), gpu_runs));
}

/// The places of the server's gate of the cores (see [`serve_places`]).
pub fn places_for(cores: usize, threads_per_run: usize) -> usize {
    let threads = if threads_per_run == 0 { cores } else { threads_per_run };
    (cores / threads.max(1)).max(1) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tenant: &str) -> Runners {
        vec![(tenant.into(), 1)]
    }

    #[test]
    fn a_tenant_alone_takes_every_core_and_its_next_run_waits() {
        let mut places: Places<&str> = Places::new(2);
        assert!(places.enter(&run("hog")) && places.enter(&run("hog")));
        assert!(!places.enter(&run("hog")), "two cores, two runs");
        places.wait(1, run("hog"), "third");
        let admitted = places.leave(&run("hog"));
        assert_eq!(admitted.iter().map(|(_, waiter)| *waiter).collect::<Vec<_>>(), ["third"]);
        assert_eq!(places.held(), 2);
    }

    #[test]
    fn another_tenants_first_run_never_waits_and_the_busy_one_drops_to_its_share() {
        let mut places: Places<&str> = Places::new(2);
        assert!(places.enter(&run("hog")) && places.enter(&run("hog")));
        places.wait(1, run("hog"), "hog-3");
        places.wait(2, run("hog"), "hog-4");
        assert!(places.enter(&run("victim")), "under its share: in at once, beside the two");
        assert_eq!(places.held(), 3);
        // A hog run ends: the hog holds one, its share of two cores beside the victim.
        assert!(places.leave(&run("hog")).is_empty());
        assert_eq!((places.held_by("hog"), places.held_by("victim")), (1, 1));
        assert!(!places.enter(&run("hog")));
        // The victim's run ends and it has no more: the hog takes both cores again.
        let admitted = places.leave(&run("victim"));
        assert_eq!(admitted.iter().map(|(_, waiter)| *waiter).collect::<Vec<_>>(), ["hog-3"]);
        assert_eq!(places.held_by("hog"), 2);
        assert_eq!(places.weight, 1, "the victim's weight left with it");
    }

    #[test]
    fn freed_places_go_to_the_tenant_holding_fewest_for_its_weight() {
        let mut places: Places<&str> = Places::new(4);
        let heavy = vec![(Arc::<str>::from("heavy"), 3)];
        for _ in 0..3 {
            assert!(places.enter(&heavy));
        }
        assert!(places.enter(&run("light")));
        // Shares of four cores: heavy 3, light 1. Both have more waiting.
        places.wait(1, heavy.clone(), "heavy");
        places.wait(2, run("light"), "light");
        // A heavy run ends: heavy holds 2 of its 3, and its waiter takes the place, not
        // light's (at its share of one).
        let admitted = places.leave(&heavy);
        assert_eq!(admitted.iter().map(|(_, waiter)| *waiter).collect::<Vec<_>>(), ["heavy"]);
        // A light one ends: light's waiter, under its share again.
        let admitted = places.leave(&run("light"));
        assert_eq!(admitted.iter().map(|(_, waiter)| *waiter).collect::<Vec<_>>(), ["light"]);
    }

    #[test]
    fn one_at_a_time_no_run_goes_beside_another_and_the_next_goes_to_a_tenant_under_its_share() {
        let mut places: Places<&str> = Places::one_at_a_time();
        assert!(places.enter(&run("hog")));
        places.wait(1, run("hog"), "hog-2");
        places.wait(2, run("hog"), "hog-3");
        assert!(!places.enter(&run("victim")), "under its share, yet the one place is taken");
        places.wait(3, run("victim"), "victim");
        // The hog's run ends: the victim's goes next, ahead of the hog's older waiters.
        let admitted = places.leave(&run("hog"));
        assert_eq!(admitted.iter().map(|(_, waiter)| *waiter).collect::<Vec<_>>(), ["victim"]);
        assert_eq!(places.held(), 1);
        let admitted = places.leave(&run("victim"));
        assert_eq!(admitted.iter().map(|(_, waiter)| *waiter).collect::<Vec<_>>(), ["hog-2"]);
        assert_eq!(places.held(), 1);
    }

    #[test]
    fn a_run_of_several_tenants_enters_on_the_share_of_any_of_them() {
        let mut places: Places<&str> = Places::new(1);
        assert!(places.enter(&run("hog")));
        let shared = vec![(Arc::<str>::from("hog"), 1), (Arc::<str>::from("victim"), 1)];
        assert!(places.enter(&shared), "the victim holds nothing: the batch it is in runs");
        assert_eq!((places.held(), places.held_by("hog"), places.held_by("victim")), (2, 2, 1));
        assert!(places.leave(&shared).is_empty());
        assert_eq!((places.held(), places.held_by("victim")), (1, 0));
    }

    #[test]
    fn a_waiter_that_gives_up_is_forgotten_and_one_given_a_place_keeps_it() {
        let mut places: Places<&str> = Places::new(1);
        assert!(places.enter(&run("a")));
        places.wait(1, run("a"), "late");
        places.wait(2, run("a"), "kept");
        let (_, late, admitted) = places.give_up(1).expect("still waiting");
        assert!(late == "late" && admitted.is_empty());
        let admitted = places.leave(&run("a"));
        assert_eq!(admitted.iter().map(|(_, waiter)| *waiter).collect::<Vec<_>>(), ["kept"]);
        assert!(places.give_up(2).is_none(), "it was given a place as its deadline passed");
        assert_eq!(places.held_by("a"), 1);
    }

    /// A run that notes the thread it ran on and, as it gives its place back, what it admitted.
    struct Noted(std::sync::mpsc::Sender<std::thread::ThreadId>);

    impl Seated for Noted {
        fn run(self: Box<Self>, place: Place) -> Vec<Admitted> {
            let _ = self.0.send(std::thread::current().id());
            place.give_back()
        }

        fn unseated(self: Box<Self>) {}
    }

    #[test]
    fn a_waiting_run_runs_on_the_thread_that_frees_a_place_or_is_given_up() {
        let gate = DeviceGate::new(DeviceId::Cpu, 1);
        let held = gate.try_enter(run("a")).expect("a free core");
        let (noted, ran_on) = std::sync::mpsc::channel();
        let Entry::Waits(given_up) = gate.enter(run("a"), Box::new(Noted(noted.clone()))) else { panic!("it ran") };
        assert!(gate.give_up(given_up).is_some(), "still waiting: given back to its caller");
        let Entry::Waits(waits) = gate.enter(run("a"), Box::new(Noted(noted))) else { panic!("it ran") };
        let admitted = held.give_back();
        assert_eq!(admitted.len(), 1, "the freed core went to the waiting run");
        assert!(gate.give_up(waits).is_none(), "given a place: it runs");
        run_admitted(admitted);
        assert_eq!(ran_on.try_iter().collect::<Vec<_>>(), [std::thread::current().id()], "on this thread, once");
        assert_eq!(gate.held(), 0, "and gave its place back");
        assert_eq!(gate.lock().weight, 0);
    }
}
