//! Fair turns on the host's CPU, the state half (the async half is [`super::turns`]). A request holds a turn while the host works for it (reading
//! and parsing its body, running its guest, encoding the answer); at most `slots` requests
//! hold one at once, and when all are taken, whose request goes next is decided per tenant
//! by weighted round robin (`compute_weight`), not by arrival order.
//!
//! Without it, requests share the CPU first come first served, so a tenant sending ten
//! times another's rate makes the other wait behind its bursts, and past capacity everyone
//! queues before the model queues' own fair share is reached (BENCHMARKS.md, noisy
//! neighbour). A request gives its turn up while it waits for a model (the batch queue is
//! fair by itself, and batches need many requests waiting there) and then waits for one
//! again in its tenant's lane, ahead of that tenant's requests still waiting to start: each
//! tenant finishes what it has begun before it starts more, while across tenants the round
//! robin holds for resumptions too (a batch of one tenant's requests coming back from a
//! model must not make another tenant's new request wait for all of them). A guest that
//! computes past an epoch tick while others wait gives its turn up and waits to resume, so
//! CPU-bound guests are time-sliced fairly between tenants; one that waits in any host call
//! (a model, a timer) gives its turn up for the wait.
//!
//! The waiting room is bounded: when it is full, an arrival whose tenant already holds at
//! least its weighted share of the waiters is refused, otherwise the newest waiter of the
//! tenant most over its share is pushed out to make room. A light tenant is never refused
//! because of a heavy one.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// What happens to an arriving request.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival<W> {
    /// A turn was free: run now.
    Run,
    /// Wait in the tenant's lane.
    Wait,
    /// Wait; this waiter of another tenant was pushed out to make room.
    WaitPushingOut(W),
    /// The waiting room is full; `over_share` when the tenant holds more than its weighted
    /// share of it (else the server is simply full).
    Refused { over_share: bool },
}

/// One tenant's waiting requests and its round-robin credit.
#[derive(Debug)]
struct Lane<W> {
    /// Requests coming back from a model call; they go before the lane's new arrivals.
    resuming: VecDeque<W>,
    /// New arrivals, oldest first.
    waiters: VecDeque<W>,
    weight: u64,
    credit: u64,
}

impl<W> Lane<W> {
    fn new(weight: u64) -> Self {
        Self { resuming: VecDeque::new(), waiters: VecDeque::new(), weight, credit: 0 }
    }

    fn is_idle(&self) -> bool {
        self.resuming.is_empty() && self.waiters.is_empty()
    }
}

/// The turn-keeping state: a plain struct, driven under a lock by [`super::turns::Turns`].
#[derive(Debug)]
pub struct TurnState<W> {
    slots: usize,
    busy: usize,
    max_waiting: usize,
    lanes: HashMap<Arc<str>, Lane<W>>,
    /// Tenants with waiters, in round-robin order; the front is being served.
    ring: VecDeque<Arc<str>>,
    waiting: usize,
}

impl<W> TurnState<W> {
    pub fn new(slots: usize, max_waiting: usize) -> Self {
        Self { slots: slots.max(1), busy: 0, max_waiting, lanes: HashMap::new(), ring: VecDeque::new(), waiting: 0 }
    }

    /// Turns held now.
    pub fn busy(&self) -> usize {
        self.busy
    }

    /// Requests waiting to start (not counting those resuming).
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Whether any request waits for a turn, to start or to resume.
    pub fn anyone_waiting(&self) -> bool {
        !self.lanes.is_empty()
    }

    /// About how many waiting requests start before a new request of `tenant` (zero when a
    /// turn is free): round robin gives each waiting tenant its weight's worth per round, so
    /// the tenant's own line, scaled by the active weight over its own, bounded by everything
    /// waiting to start. With the rate waiting requests start this predicts the new request's
    /// wait (resumptions are not counted: that rate includes them). Also whether the tenant
    /// already holds more than its weighted share of the line.
    pub fn ahead_of(&self, tenant: &Arc<str>, weight: u32) -> (usize, bool) {
        if self.busy < self.slots {
            return (0, false);
        }
        let weight = u64::from(weight.max(1));
        let (mut total, mut active_weight) = (0u64, weight);
        for (other, lane) in &self.lanes {
            total += lane.waiters.len() as u64;
            if other != tenant {
                active_weight += lane.weight;
            }
        }
        let own = self.lanes.get(tenant).map_or(0, |lane| lane.waiters.len() as u64);
        let ahead = ((own + 1) * active_weight).div_ceil(weight).saturating_sub(1).min(total);
        let over_share = active_weight > weight && (own + 1) * active_weight > total.max(1) * weight;
        (usize::try_from(ahead).unwrap_or(usize::MAX), over_share)
    }

    /// A new request of `tenant` (with its weight) arrives.
    pub fn arrive(&mut self, tenant: &Arc<str>, weight: u32, waiter: W) -> Arrival<W> {
        if self.busy < self.slots {
            self.busy += 1;
            return Arrival::Run;
        }
        let weight = u64::from(weight.max(1));
        let mut pushed_out = None;
        if self.waiting >= self.max_waiting {
            let own = self.lanes.get(tenant).map_or(0, |lane| lane.waiters.len() as u64);
            // Shares compare as waiters per unit of weight: (own + 1) / weight vs n / w.
            let heaviest = self
                .lanes
                .iter()
                .filter(|(other, _)| *other != tenant)
                .max_by_key(|(_, lane)| lane.waiters.len() as u64 * 1_000_000 / lane.weight)
                .map(|(other, lane)| (other.clone(), lane.waiters.len() as u64, lane.weight));
            match heaviest {
                Some((other, count, other_weight)) if (own + 1) * other_weight < count * weight => {
                    let lane = self.lanes.get_mut(&other).expect("the heaviest lane exists");
                    pushed_out = lane.waiters.pop_back();
                    self.waiting -= 1;
                    self.forget_idle_lanes();
                }
                _ => {
                    let total_weight: u64 =
                        weight + self.lanes.iter().filter(|(t, _)| *t != tenant).map(|(_, l)| l.weight).sum::<u64>();
                    let fair = self.max_waiting as u64 * weight / total_weight;
                    return Arrival::Refused { over_share: own + 1 > fair && total_weight > weight };
                }
            }
        }
        self.lane(tenant, weight).waiters.push_back(waiter);
        self.waiting += 1;
        match pushed_out {
            Some(waiter) => Arrival::WaitPushingOut(waiter),
            None => Arrival::Wait,
        }
    }

    /// A request of `tenant` that gave its turn up for a model call wants one again: `true`
    /// if it runs now, else it waits in its tenant's lane, before the lane's new arrivals.
    /// Resumptions are never refused: their requests already hold the tenant's admission.
    pub fn resume(&mut self, tenant: &Arc<str>, weight: u32, waiter: W) -> bool {
        if self.busy < self.slots {
            self.busy += 1;
            return true;
        }
        self.lane(tenant, u64::from(weight.max(1))).resuming.push_back(waiter);
        false
    }

    /// A turn is given back; returns the waiter it passes to, if any (already counted busy).
    pub fn release(&mut self) -> Option<W> {
        self.busy = self.busy.saturating_sub(1);
        let next = self.next_waiter()?;
        self.busy += 1;
        Some(next)
    }

    /// Take a waiter out (its request went away); `true` if it was still waiting.
    pub fn remove(&mut self, tenant: &Arc<str>, is_it: impl Fn(&W) -> bool) -> bool {
        let Some(lane) = self.lanes.get_mut(tenant) else { return false };
        if let Some(position) = lane.resuming.iter().position(&is_it) {
            lane.resuming.remove(position);
        } else if let Some(position) = lane.waiters.iter().position(&is_it) {
            lane.waiters.remove(position);
            self.waiting -= 1;
        } else {
            return false;
        }
        self.forget_idle_lanes();
        true
    }

    /// `tenant`'s lane, joining the ring if it had nobody waiting.
    fn lane(&mut self, tenant: &Arc<str>, weight: u64) -> &mut Lane<W> {
        let lane = self.lanes.entry(tenant.clone()).or_insert_with(|| Lane::new(weight));
        lane.weight = weight;
        if lane.is_idle() {
            self.ring.push_back(tenant.clone());
        }
        lane
    }

    /// Weighted deficit round robin with unit cost: the tenant at the front of the ring is
    /// served while it has credit (its resumptions first); otherwise it earns its weight and
    /// the next one's turn comes.
    fn next_waiter(&mut self) -> Option<W> {
        loop {
            let tenant = self.ring.front()?.clone();
            let lane = self.lanes.get_mut(&tenant)?;
            if lane.credit >= 1 {
                lane.credit -= 1;
                let waiter = match lane.resuming.pop_front() {
                    Some(resuming) => Some(resuming),
                    None => {
                        self.waiting -= 1;
                        lane.waiters.pop_front()
                    }
                };
                self.forget_idle_lanes();
                return waiter;
            }
            lane.credit += lane.weight;
            self.ring.rotate_left(1);
        }
    }

    /// Lanes without waiters leave the ring and lose their credit.
    fn forget_idle_lanes(&mut self) {
        self.lanes.retain(|_, lane| !lane.is_idle());
        let lanes = &self.lanes;
        self.ring.retain(|tenant| lanes.contains_key(tenant));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> Arc<str> {
        name.into()
    }

    #[test]
    fn the_line_ahead_of_a_new_request_follows_the_round_robin() {
        let mut state = TurnState::new(1, 64);
        let (a, b) = (tenant("a"), tenant("b"));
        assert_eq!(state.ahead_of(&a, 1), (0, false), "a free turn: nobody ahead");
        assert_eq!(state.arrive(&a, 1, 0), Arrival::Run);
        for n in 1..=9 {
            assert_eq!(state.arrive(&a, 1, n), Arrival::Wait);
        }
        // b alone in its lane: it is served after at most one of a's.
        assert_eq!(state.ahead_of(&b, 1), (1, false));
        // a's new request waits behind a's nine, and a holds more than its share.
        assert_eq!(state.ahead_of(&a, 1), (9, false), "alone, a is not over a share");
        assert_eq!(state.arrive(&b, 1, 100), Arrival::Wait);
        assert_eq!(state.ahead_of(&a, 1), (10, true));
        // A heavier b (weight 3): its second request waits behind its first and one of a's.
        assert_eq!(state.ahead_of(&b, 3), (2, false));
    }

    #[test]
    fn turns_are_free_until_every_slot_is_busy() {
        let mut state = TurnState::new(2, 8);
        assert_eq!(state.arrive(&tenant("a"), 1, 1), Arrival::Run);
        assert_eq!(state.arrive(&tenant("a"), 1, 2), Arrival::Run);
        assert_eq!(state.arrive(&tenant("a"), 1, 3), Arrival::Wait);
        assert_eq!(state.release(), Some(3), "the waiter takes the freed turn");
        assert_eq!(state.busy(), 2);
        assert_eq!(state.release(), None);
        assert_eq!(state.busy(), 1);
    }

    #[test]
    fn waiters_are_served_by_weighted_round_robin_not_arrival_order() {
        let mut state = TurnState::new(1, 100_000);
        assert_eq!(state.arrive(&tenant("x"), 1, 0), Arrival::Run);
        // A floods first; B and C arrive after all of A's requests.
        for id in 1..=6000 {
            assert_eq!(state.arrive(&tenant("a"), 1, id), Arrival::Wait);
        }
        for id in 10_001..=16_000 {
            assert_eq!(state.arrive(&tenant("b"), 2, id), Arrival::Wait);
        }
        for id in 20_001..=26_000 {
            assert_eq!(state.arrive(&tenant("c"), 4, id), Arrival::Wait);
        }
        let mut served = [0u32; 3];
        for _ in 0..7000 {
            let id = state.release().expect("a waiter");
            served[(id / 10_000) as usize] += 1;
        }
        let expected = [1000.0, 2000.0, 4000.0];
        for (count, expected) in served.iter().zip(expected) {
            assert!((f64::from(*count) - expected).abs() <= expected * 0.05, "served {served:?}");
        }
    }

    #[test]
    fn a_resuming_request_goes_before_its_tenants_new_arrivals() {
        let mut state = TurnState::new(1, 8);
        assert_eq!(state.arrive(&tenant("a"), 1, 1), Arrival::Run);
        assert_eq!(state.arrive(&tenant("b"), 1, 2), Arrival::Wait);
        // Request 1 pauses for a model call: its turn goes to 2.
        assert_eq!(state.release(), Some(2));
        assert_eq!(state.arrive(&tenant("a"), 1, 3), Arrival::Wait);
        assert!(!state.resume(&tenant("a"), 1, 1), "no turn free: 1 is queued to resume");
        assert_eq!(state.release(), Some(1), "1 resumes before a's newer 3 starts");
        assert_eq!(state.release(), Some(3));
    }

    #[test]
    fn resumptions_take_turns_with_other_tenants() {
        let mut state = TurnState::new(1, 100);
        assert_eq!(state.arrive(&tenant("x"), 1, 0), Arrival::Run);
        // A batch of a's requests comes back from the model while b's new request waits.
        for id in 1..=10 {
            assert!(!state.resume(&tenant("a"), 1, id));
        }
        assert_eq!(state.arrive(&tenant("b"), 1, 100), Arrival::Wait);
        let order: Vec<_> = std::iter::from_fn(|| state.release()).collect();
        let b_at = order.iter().position(|id| *id == 100).expect("b is served");
        assert!(b_at <= 1, "b starts after at most one of a's resumptions: {order:?}");
        assert_eq!(order.len(), 11);
        assert_eq!(state.waiting(), 0);
    }

    #[test]
    fn a_removed_resumption_is_never_served() {
        let mut state = TurnState::new(1, 8);
        assert_eq!(state.arrive(&tenant("a"), 1, 1), Arrival::Run);
        assert!(!state.resume(&tenant("b"), 1, 2));
        assert_eq!(state.arrive(&tenant("c"), 1, 3), Arrival::Wait);
        assert!(state.remove(&tenant("b"), |id| *id == 2));
        assert_eq!(state.release(), Some(3));
        assert_eq!(state.release(), None);
    }

    #[test]
    fn a_full_waiting_room_pushes_out_the_heaviest_tenant_for_a_light_one() {
        let mut state = TurnState::new(1, 4);
        assert_eq!(state.arrive(&tenant("a"), 1, 0), Arrival::Run);
        for id in 1..=4 {
            assert_eq!(state.arrive(&tenant("a"), 1, id), Arrival::Wait);
        }
        assert_eq!(state.arrive(&tenant("a"), 1, 5), Arrival::Refused { over_share: false }, "only a waits");
        assert_eq!(state.arrive(&tenant("b"), 1, 6), Arrival::WaitPushingOut(4), "a's newest makes room");
        assert_eq!(state.arrive(&tenant("b"), 1, 7), Arrival::WaitPushingOut(3));
        assert_eq!(state.arrive(&tenant("a"), 1, 8), Arrival::Refused { over_share: true });
        assert_eq!(state.arrive(&tenant("b"), 1, 9), Arrival::Refused { over_share: true }, "even shares: b keeps 2");
        assert_eq!(state.waiting(), 4);
    }

    #[test]
    fn a_removed_waiter_is_never_served() {
        let mut state = TurnState::new(1, 8);
        assert_eq!(state.arrive(&tenant("a"), 1, 1), Arrival::Run);
        assert_eq!(state.arrive(&tenant("a"), 1, 2), Arrival::Wait);
        assert_eq!(state.arrive(&tenant("b"), 1, 3), Arrival::Wait);
        assert!(state.remove(&tenant("a"), |id| *id == 2));
        assert!(!state.remove(&tenant("a"), |id| *id == 2), "already gone");
        assert_eq!(state.release(), Some(3));
        assert_eq!(state.release(), None);
        assert_eq!(state.waiting(), 0);
    }
}
