//! The batch-forming state of one model queue: a plain struct with pure methods, driven
//! by the queue's actor task and unit-tested without async.
//!
//! In: jobs (named input tensors, row count, deadline, tenant and its compute weight).
//! Out: batches of jobs whose inputs can be stacked along the first dimension, formed when
//! enough rows wait or the oldest job has waited the maximum queue delay. Jobs of one model
//! from many tenants share batches; which tenant's jobs go next is decided by weighted
//! deficit round robin over per-tenant lanes, so a tenant flooding the queue cannot starve
//! another. Jobs past their deadline, or whose caller has gone, are dropped before compute.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::padding::PaddingRule;
use crate::tensor::{ElementType, Tensor};

/// A job's inputs as batching sees them: per input (sorted), its name, element type and
/// trailing dims.
type Shape = Vec<(String, ElementType, Vec<usize>)>;

/// What makes two jobs stackable: equal shapes. Most models' jobs all have one shape, so the
/// first a queue meets is named, not spelled out: its jobs' keys are built without allocating
/// and compared without reading strings, and are shared without a reference count that every
/// caller's core would write to (see [`FirstShape`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShapeKey {
    /// The shape of the queue's [`FirstShape`].
    First,
    /// Any other.
    Other(Shape),
}

/// The shape of a job's inputs; a padded dimension as the job's length class
/// ([`PaddingRule::length_class`]), which any length of that class matches.
fn shape_of(inputs: &[(String, Tensor)], padding: Option<&PaddingRule>) -> Shape {
    let class = padding.map_or(0, |rule| rule.length_class(inputs));
    let mut shape: Shape =
        inputs.iter().map(|(name, t)| (name.clone(), t.ty(), trailing(name, t, padding, class))).collect();
    shape.sort();
    shape
}

/// A tensor's dims after the first, the padded one (if any) as `class`.
fn trailing(name: &str, tensor: &Tensor, padding: Option<&PaddingRule>, class: usize) -> Vec<usize> {
    let mut dims = tensor.dims().get(1..).unwrap_or_default().to_vec();
    if let Some(rule) = padding.filter(|rule| rule.pads(name, tensor.dims().len())) {
        dims[rule.axis - 1] = class;
    }
    dims
}

/// The shape of the first job a queue keyed, kept for the queue's life. Whoever sends first
/// chooses it; jobs of any other shape have their keys built in full, as all did before.
#[derive(Debug, Default)]
pub struct FirstShape(std::sync::OnceLock<Shape>);

/// Inputs beyond which a job is not matched against the first shape (matching compares each
/// input with each).
const MATCHED_INPUTS: usize = 16;

impl FirstShape {
    /// The shape key of `inputs`.
    pub fn key_of(&self, inputs: &[(String, Tensor)], padding: Option<&PaddingRule>) -> ShapeKey {
        let matchable = inputs.len() <= MATCHED_INPUTS;
        if let Some(first) = self.0.get().filter(|first| matchable && Self::matches(first, inputs, padding)) {
            debug_assert_eq!(*first, shape_of(inputs, padding));
            return ShapeKey::First;
        }
        let shape = shape_of(inputs, padding);
        // A shape naming an input twice is never the first: matching pairs each of its inputs
        // with one.
        if matchable
            && shape.windows(2).all(|pair| pair[0].0 != pair[1].0)
            && *self.0.get_or_init(|| shape.clone()) == shape
        {
            return ShapeKey::First;
        }
        ShapeKey::Other(shape)
    }

    /// Whether `inputs` have `shape` (whose names are distinct): each of its entries is met by
    /// an input of that name, and there are no more inputs.
    fn matches(shape: &Shape, inputs: &[(String, Tensor)], padding: Option<&PaddingRule>) -> bool {
        let class = padding.map(|rule| rule.length_class(inputs));
        shape.len() == inputs.len()
            && shape.iter().all(|(name, ty, dims)| {
                inputs.iter().find(|(input, _)| input == name).is_some_and(|(_, tensor)| {
                    let own = tensor.dims().get(1..).unwrap_or_default();
                    let padded = padding.filter(|rule| rule.pads(name, tensor.dims().len())).map(|rule| rule.axis - 1);
                    tensor.ty() == *ty
                        && own.len() == dims.len()
                        && own.iter().zip(dims).enumerate().all(|(axis, (own, shaped))| match padded == Some(axis) {
                            true => Some(*shaped) == class,
                            false => own == shaped,
                        })
                })
            })
    }
}

/// Who a job is for, that tenant's share of compute (`compute_weight`), the request's
/// priority among the tenant's own jobs, and the request's bill its jobs' compute is charged to.
#[derive(Debug, Clone)]
pub struct Share {
    pub tenant: Arc<str>,
    pub weight: u32,
    /// Triton's request priority: 1 is the most urgent; [`DEFAULT_PRIORITY`] when unset.
    pub priority: u64,
    pub bill: Bill,
    /// The most bytes of outputs the caller can take: a job over it is answered with its size
    /// before its outputs are copied out of the engine.
    pub max_output_bytes: usize,
    /// The caller's name for the model, its metrics' label: identical weights of several
    /// tenants are one copy, made under the name the first of them gave it.
    pub model: Arc<str>,
}

/// The priority of a request that names none (or 0, as Triton reads it): after every named one.
pub const DEFAULT_PRIORITY: u64 = u64::MAX;

impl Share {
    /// A share with a fresh bill (one per request), at the default priority.
    pub fn new(tenant: Arc<str>, weight: u32) -> Self {
        Self {
            tenant,
            weight,
            priority: DEFAULT_PRIORITY,
            bill: Bill::default(),
            max_output_bytes: usize::MAX,
            model: Arc::default(),
        }
    }

    /// The same share for a caller that can take at most `bytes` of outputs.
    pub fn with_output_limit(self, bytes: usize) -> Self {
        Self { max_output_bytes: bytes, ..self }
    }

    /// The same share at `priority` (0: the default).
    pub fn with_priority(self, priority: u64) -> Self {
        Self { priority: if priority == 0 { DEFAULT_PRIORITY } else { priority }, ..self }
    }
}

/// What one request's model calls cost: each batch's compute time split over its jobs by
/// rows. Shared by every job of the request (clones are the same bill).
#[derive(Debug, Clone, Default)]
pub struct Bill(Arc<std::sync::atomic::AtomicU64>);

impl Bill {
    pub fn charge(&self, compute: Duration) {
        let nanos = u64::try_from(compute.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(nanos, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// A job as the queue state sees it; `P` is the caller's payload (inputs and reply).
#[derive(Debug)]
pub struct Queued<P> {
    pub payload: P,
    pub rows: usize,
    pub key: ShapeKey,
    pub share: Share,
    pub enqueued: Instant,
    pub deadline: Instant,
}

/// Settings of one queue.
#[derive(Debug, Clone)]
pub struct QueuePolicy {
    pub max_batch_rows: usize,
    /// Preferred batch sizes: a batch is formed as soon as the largest fills, and cut to the
    /// largest the waiting rows fill; when none fills, every waiting row may go.
    pub preferred_batch_rows: Vec<usize>,
    pub max_delay: Duration,
    /// Whether the model has a batch dimension; if not, jobs run one at a time.
    pub batchable: bool,
}

/// Jobs removed without compute.
#[derive(Debug)]
pub struct Dropped<P> {
    pub expired: Vec<Queued<P>>,
    pub abandoned: Vec<Queued<P>>,
}

/// One tenant's waiting jobs (most urgent first, then oldest first) and its round-robin
/// credit in rows.
#[derive(Debug)]
struct Lane<P> {
    jobs: VecDeque<Queued<P>>,
    weight: u64,
    deficit: u64,
}

/// The queue of one model.
#[derive(Debug)]
pub struct BatchQueue<P> {
    policy: QueuePolicy,
    lanes: HashMap<Arc<str>, Lane<P>>,
    /// Tenants with waiting jobs, in round-robin order; the front is being served.
    ring: VecDeque<Arc<str>>,
    rows: usize,
    /// Emptied lanes' storage, for the next tenants' lanes: a lane empties whenever a batch
    /// takes all its jobs, and growing a new one job by job reallocated it each time.
    spare: Vec<VecDeque<Queued<P>>>,
}

/// How many emptied lanes' storage a queue keeps, each for how many jobs at most.
const SPARE_LANES: usize = 4;
const SPARE_LANE_JOBS: usize = 128;

impl<P> BatchQueue<P> {
    pub fn new(policy: QueuePolicy) -> Self {
        Self { policy, lanes: HashMap::new(), ring: VecDeque::new(), rows: 0, spare: Vec::new() }
    }

    /// Rows waiting.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows that make a batch full: the largest preferred size, else the most a batch takes.
    fn full_rows(&self) -> usize {
        self.policy.preferred_batch_rows.iter().copied().max().unwrap_or(self.policy.max_batch_rows)
    }

    /// Whether a full batch waits (any job, for a model that does not batch): one that would
    /// leave now, whatever the delay, and no bigger for waiting longer.
    pub fn holds_a_full_batch(&self) -> bool {
        !self.is_empty() && (!self.policy.batchable || self.rows >= self.full_rows())
    }

    pub fn len(&self) -> usize {
        self.lanes.values().map(|lane| lane.jobs.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    pub fn push(&mut self, job: Queued<P>) {
        self.rows += job.rows;
        let tenant = job.share.tenant.clone();
        let weight = u64::from(job.share.weight.max(1));
        let spare = &mut self.spare;
        let lane = self.lanes.entry(tenant.clone()).or_insert_with(|| Lane {
            jobs: spare.pop().unwrap_or_default(),
            weight,
            deficit: 0,
        });
        lane.weight = weight;
        if lane.jobs.is_empty() {
            self.ring.push_back(tenant);
        }
        // Priority orders the tenant's own jobs only: between tenants the round robin rules.
        // The lane is in priority order, so the place is found by halving, not by a walk
        // along every job waiting (at the back, for jobs of one priority).
        let position = lane.jobs.partition_point(|queued| queued.share.priority <= job.share.priority);
        lane.jobs.insert(position, job);
    }

    /// Remove jobs past their deadline and jobs whose caller has gone.
    pub fn drop_stale(&mut self, now: Instant, caller_gone: impl Fn(&P) -> bool) -> Dropped<P> {
        let mut dropped = Dropped { expired: Vec::new(), abandoned: Vec::new() };
        let stale = |job: &Queued<P>| job.deadline <= now || caller_gone(&job.payload);
        // Most wake-ups find none: the lanes are rebuilt only where one is.
        for lane in self.lanes.values_mut().filter(|lane| lane.jobs.iter().any(stale)) {
            let mut kept = VecDeque::with_capacity(lane.jobs.len());
            for job in lane.jobs.drain(..) {
                if caller_gone(&job.payload) {
                    self.rows -= job.rows;
                    dropped.abandoned.push(job);
                } else if job.deadline <= now {
                    self.rows -= job.rows;
                    dropped.expired.push(job);
                } else {
                    kept.push_back(job);
                }
            }
            lane.jobs = kept;
        }
        self.forget_idle_lanes();
        dropped
    }

    /// Take every waiting job out (their model could not be loaded).
    pub fn drain(&mut self) -> Vec<Queued<P>> {
        let jobs: Vec<Queued<P>> = self.lanes.values_mut().flat_map(|lane| lane.jobs.drain(..)).collect();
        self.rows = 0;
        self.forget_idle_lanes();
        jobs
    }

    /// When the job that has waited longest was queued (an urgent job may stand before
    /// older ones in its lane).
    pub fn oldest_enqueued(&self) -> Option<Instant> {
        self.lanes.values().flat_map(|lane| &lane.jobs).map(|job| job.enqueued).min()
    }

    /// When the oldest job's delay runs out (the actor's next wake-up).
    pub fn next_due(&self) -> Option<Instant> {
        self.oldest_enqueued().map(|oldest| oldest + self.policy.max_delay)
    }

    /// The next batch, if one is due: due when the waiting rows fill a batch or the oldest
    /// job has waited the maximum delay. Round robin picks the job that leads the batch;
    /// later picks fill it with jobs of the same shape key, up to the row limit (a job
    /// larger than the limit runs alone).
    pub fn pop_batch(&mut self, now: Instant) -> Option<Vec<Queued<P>>> {
        let due = self.next_due()?;
        if self.policy.batchable && now < due && self.rows < self.full_rows() {
            return None;
        }
        let first = self.next_job(None, usize::MAX)?;
        if !self.policy.batchable {
            return Some(vec![first]);
        }
        let key = first.key.clone();
        let mut rows = first.rows;
        let same_shape_rows = rows + self.rows_with(&key);
        let target = self
            .policy
            .preferred_batch_rows
            .iter()
            .copied()
            .filter(|&preferred| preferred <= same_shape_rows)
            .max()
            .unwrap_or(self.policy.max_batch_rows)
            .min(self.policy.max_batch_rows);
        // At most a job a row (the rows left, or the room left in the batch): room for them all.
        let mut batch = Vec::with_capacity(1 + self.rows.min(target - rows.min(target)));
        batch.push(first);
        while rows < target {
            let Some(job) = self.next_job(Some(&key), target - rows) else { break };
            rows += job.rows;
            batch.push(job);
        }
        Some(batch)
    }

    /// The next job in weighted deficit round robin among jobs with `key` (any key when
    /// `None`) and at most `max_rows` rows. The tenant at the front of the ring is served
    /// while its credit covers its next job; otherwise it earns its weight in credit and the
    /// next tenant's turn comes. A tenant whose jobs of `key` are all too large for the room
    /// left ends the batch (`None`) rather than be passed over.
    fn next_job(&mut self, key: Option<&ShapeKey>, max_rows: usize) -> Option<Queued<P>> {
        let eligible = |job: &Queued<P>| job.rows <= max_rows && key.is_none_or(|k| &job.key == k);
        if !self.lanes.values().any(|lane| lane.jobs.iter().any(eligible)) {
            return None;
        }
        loop {
            let tenant = self.ring.front()?.clone();
            let lane = self.lanes.get_mut(&tenant)?;
            if let Some(position) = lane.jobs.iter().position(eligible) {
                let rows = lane.jobs[position].rows as u64;
                if lane.deficit >= rows {
                    lane.deficit -= rows;
                    let job = lane.jobs.remove(position)?;
                    self.rows -= job.rows;
                    if lane.jobs.is_empty() {
                        // Its lane leaves the ring (it is at the front) and loses its credit.
                        self.ring.pop_front();
                        if let Some(mut emptied) = self.lanes.remove(&tenant).map(|lane| lane.jobs)
                            && self.spare.len() < SPARE_LANES
                        {
                            emptied.shrink_to(SPARE_LANE_JOBS);
                            self.spare.push(emptied);
                        }
                    }
                    return Some(job);
                }
                lane.deficit += lane.weight;
            } else if key.is_some() && lane.jobs.iter().any(|job| key.is_none_or(|k| &job.key == k)) {
                // Its next job of this shape does not fit in the room left: the batch ends
                // here, so that others filling it do not take turns it has not had (which
                // would tilt the shares towards tenants that send small jobs).
                return None;
            }
            self.ring.rotate_left(1);
        }
    }

    /// Rows waiting with shape key `key`.
    fn rows_with(&self, key: &ShapeKey) -> usize {
        self.lanes.values().flat_map(|lane| &lane.jobs).filter(|job| &job.key == key).map(|job| job.rows).sum()
    }

    /// Lanes without jobs leave the ring and lose their credit (as DRR prescribes).
    fn forget_idle_lanes(&mut self) {
        self.lanes.retain(|_, lane| !lane.jobs.is_empty());
        let lanes = &self.lanes;
        self.ring.retain(|tenant| lanes.contains_key(tenant));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_batch_rows: usize, batchable: bool) -> QueuePolicy {
        QueuePolicy {
            max_batch_rows,
            preferred_batch_rows: Vec::new(),
            max_delay: Duration::from_millis(10),
            batchable,
        }
    }

    fn job(id: u32, rows: usize, key: &str, at: Instant) -> Queued<u32> {
        tenant_job(id, rows, key, at, "t", 1)
    }

    fn tenant_job(id: u32, rows: usize, key: &str, at: Instant, tenant: &str, weight: u32) -> Queued<u32> {
        Queued {
            payload: id,
            rows,
            key: ShapeKey::Other(vec![(key.to_string(), ElementType::F32, vec![4])]),
            share: Share::new(tenant.into(), weight),
            enqueued: at,
            deadline: at + Duration::from_secs(1),
        }
    }

    fn ids(batch: &[Queued<u32>]) -> Vec<u32> {
        batch.iter().map(|j| j.payload).collect()
    }

    fn input(name: &str, ty: ElementType, dims: &[usize]) -> (String, Tensor) {
        let bytes = dims.iter().product::<usize>() * ty.size();
        (name.to_string(), Tensor::new(ty, dims.to_vec(), vec![0; bytes]).expect("a tensor"))
    }

    #[test]
    fn jobs_of_the_first_shape_are_keyed_by_name_and_others_in_full() {
        let first = FirstShape::default();
        let f32 = ElementType::F32;
        assert_eq!(first.key_of(&[input("x", f32, &[1, 4]), input("y", f32, &[1, 2])], None), ShapeKey::First);
        // More rows, the inputs in another order: the same shape.
        assert_eq!(first.key_of(&[input("y", f32, &[3, 2]), input("x", f32, &[3, 4])], None), ShapeKey::First);
        // Each way of differing is another shape, keyed in full; the first stays the first.
        let others = [
            vec![input("x", f32, &[1, 5]), input("y", f32, &[1, 2])],
            vec![input("x", ElementType::I64, &[1, 4]), input("y", f32, &[1, 2])],
            vec![input("x", f32, &[1, 4]), input("z", f32, &[1, 2])],
            vec![input("x", f32, &[1, 4])],
            vec![input("x", f32, &[1, 4]), input("y", f32, &[1, 2]), input("z", f32, &[1])],
            vec![input("x", f32, &[1, 4, 1]), input("y", f32, &[1, 2])],
            // An input named twice does not stand for another.
            vec![input("x", f32, &[1, 4]), input("x", f32, &[1, 4])],
        ];
        for inputs in others {
            assert_eq!(first.key_of(&inputs, None), ShapeKey::Other(shape_of(&inputs, None)), "{inputs:?}");
            let again = first.key_of(&[input("x", f32, &[2, 4]), input("y", f32, &[2, 2])], None);
            assert_eq!(again, ShapeKey::First, "the first shape again");
        }
        // A shape naming an input twice is never the first: the one after it may be.
        let first = FirstShape::default();
        let twice = [input("x", f32, &[1, 4]), input("x", f32, &[1, 4])];
        assert_eq!(first.key_of(&twice, None), ShapeKey::Other(shape_of(&twice, None)));
        assert_eq!(first.key_of(&[input("x", f32, &[1, 4]), input("y", f32, &[1, 4])], None), ShapeKey::First);
        assert_eq!(first.key_of(&twice, None), ShapeKey::Other(shape_of(&twice, None)));
    }

    #[test]
    fn a_padded_axis_matches_the_first_shape_at_any_length_of_its_class() {
        let first = FirstShape::default();
        let rule = PaddingRule { axis: 1, fill: 0.0, inputs: vec!["ids".into()], outputs: Vec::new() };
        let (i64, f32) = (ElementType::I64, ElementType::F32);
        let ids = |rows, length| [input("ids", i64, &[rows, length]), input("scale", f32, &[rows, 3])];
        let short = first.key_of(&ids(1, 5), Some(&rule));
        let long = first.key_of(&ids(2, 8), Some(&rule));
        assert_eq!((short, long), (ShapeKey::First, ShapeKey::First), "5 and 8 round up to 8");
        // A longer one is another class: padding the short ones to it would more than double them.
        for length in [9, 16, 1 << 20] {
            let longer = ids(1, length);
            assert_eq!(first.key_of(&longer, Some(&rule)), ShapeKey::Other(shape_of(&longer, Some(&rule))));
        }
        assert_eq!(shape_of(&ids(1, 9), Some(&rule)), shape_of(&ids(3, 16), Some(&rule)));
        assert_ne!(shape_of(&ids(1, 16), Some(&rule)), shape_of(&ids(1, 17), Some(&rule)));
        // The axis of an input the rule does not pad must still agree.
        let other = [input("ids", i64, &[1, 5]), input("scale", f32, &[1, 4])];
        assert_eq!(first.key_of(&other, Some(&rule)), ShapeKey::Other(shape_of(&other, Some(&rule))));
        // Without the rule, the lengths differ.
        let unpadded = FirstShape::default();
        assert_eq!(unpadded.key_of(&[input("ids", i64, &[1, 5])], None), ShapeKey::First);
        assert_ne!(unpadded.key_of(&[input("ids", i64, &[1, 9])], None), ShapeKey::First);
    }

    #[test]
    fn priority_orders_a_tenants_own_jobs_and_not_the_round_robin() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(1, true));
        let urgent = |mut job: Queued<u32>, priority| {
            job.share = job.share.with_priority(priority);
            job
        };
        queue.push(job(1, 1, "x", t0));
        queue.push(job(2, 1, "x", t0));
        queue.push(urgent(job(3, 1, "x", t0 + Duration::from_millis(1)), 2));
        queue.push(urgent(job(4, 1, "x", t0 + Duration::from_millis(2)), 1));
        queue.push(urgent(job(5, 1, "x", t0 + Duration::from_millis(3)), 2));
        queue.push(urgent(job(6, 1, "x", t0 + Duration::from_millis(3)), 0));
        assert_eq!(queue.next_due(), Some(t0 + Duration::from_millis(10)), "the oldest job still sets the delay");
        let order: Vec<u32> = (0..6).flat_map(|_| ids(&queue.pop_batch(t0).expect("a full batch"))).collect();
        assert_eq!(order, vec![4, 3, 5, 1, 2, 6], "most urgent first; equal ones and the default in arrival order");

        // Another tenant's default job is not passed by this tenant's urgent ones.
        queue.push(tenant_job(7, 1, "x", t0, "other", 1));
        queue.push(urgent(job(8, 1, "x", t0), 1));
        queue.push(urgent(job(9, 1, "x", t0), 1));
        let order: Vec<u32> = (0..3).flat_map(|_| ids(&queue.pop_batch(t0).expect("a batch"))).collect();
        assert_eq!(order[..2].iter().filter(|&&id| id == 7).count(), 1, "round robin between tenants: {order:?}");
    }

    #[test]
    fn forms_a_batch_when_rows_fill_it() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(4, true));
        queue.push(job(1, 2, "x", t0));
        assert!(queue.pop_batch(t0).is_none(), "half a batch waits for its delay");
        queue.push(job(2, 2, "x", t0));
        queue.push(job(3, 1, "x", t0));
        let batch = queue.pop_batch(t0).expect("four rows fill the batch");
        assert_eq!(ids(&batch), vec![1, 2]);
        assert_eq!(queue.len(), 1);
    }

    #[test]
    fn batches_are_cut_to_preferred_sizes() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(QueuePolicy { preferred_batch_rows: vec![4, 8], ..policy(32, true) });
        for id in 0..7 {
            queue.push(job(id, 1, "x", t0));
        }
        assert!(queue.pop_batch(t0).is_none(), "seven rows fill no 8-row batch before the delay");
        let late = t0 + Duration::from_millis(10);
        assert_eq!(queue.pop_batch(late).expect("delay ran out").len(), 4, "cut to the largest preferred size");
        assert_eq!(queue.pop_batch(late).expect("the rest").len(), 3, "no preferred size fills: all go");
        for id in 0..10 {
            queue.push(job(id, 1, "x", t0));
        }
        assert_eq!(queue.pop_batch(t0).expect("the largest preferred size fills").len(), 8);
    }

    #[test]
    fn forms_a_batch_when_the_delay_runs_out() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(32, true));
        queue.push(job(1, 1, "x", t0));
        queue.push(job(2, 1, "x", t0 + Duration::from_millis(3)));
        assert_eq!(queue.next_due(), Some(t0 + Duration::from_millis(10)));
        assert!(queue.pop_batch(t0 + Duration::from_millis(9)).is_none());
        let batch = queue.pop_batch(t0 + Duration::from_millis(10)).expect("delay ran out");
        assert_eq!(ids(&batch), vec![1, 2]);
    }

    #[test]
    fn only_equal_shapes_share_a_batch() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(8, true));
        queue.push(job(1, 1, "x", t0));
        queue.push(job(2, 1, "y", t0));
        queue.push(job(3, 1, "x", t0));
        let later = t0 + Duration::from_millis(20);
        assert_eq!(ids(&queue.pop_batch(later).expect("due")), vec![1, 3]);
        assert_eq!(ids(&queue.pop_batch(later).expect("due")), vec![2]);
        assert!(queue.is_empty());
    }

    #[test]
    fn models_without_a_batch_dimension_run_one_job_at_a_time() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(8, false));
        queue.push(job(1, 1, "x", t0));
        queue.push(job(2, 1, "x", t0));
        assert_eq!(ids(&queue.pop_batch(t0).expect("runs at once")), vec![1]);
        assert_eq!(ids(&queue.pop_batch(t0).expect("runs at once")), vec![2]);
    }

    #[test]
    fn a_batch_is_full_at_the_largest_preferred_size_or_the_most_rows() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(4, true));
        assert!(!queue.holds_a_full_batch());
        (1..=3).for_each(|id| queue.push(job(id, 1, "x", t0)));
        assert!(!queue.holds_a_full_batch(), "3 of 4 rows");
        queue.push(job(4, 1, "x", t0));
        assert!(queue.holds_a_full_batch(), "4 of 4 rows");
        let mut queue = BatchQueue::new(QueuePolicy { preferred_batch_rows: vec![2, 3], ..policy(8, true) });
        (1..=2).for_each(|id| queue.push(job(id, 1, "x", t0)));
        assert!(!queue.holds_a_full_batch(), "2 rows: more may come for a batch of 3");
        queue.push(job(3, 1, "x", t0));
        assert!(queue.holds_a_full_batch(), "the largest preferred size");
        assert_eq!(ids(&queue.pop_batch(t0).expect("leaves before its delay")), vec![1, 2, 3]);
        let mut queue = BatchQueue::new(policy(8, false));
        queue.push(job(1, 1, "x", t0));
        assert!(queue.holds_a_full_batch(), "a model that does not batch: every job");
    }

    #[test]
    fn an_oversized_job_still_runs_alone() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(4, true));
        queue.push(job(1, 9, "x", t0));
        queue.push(job(2, 1, "x", t0));
        assert_eq!(ids(&queue.pop_batch(t0).expect("full")), vec![1]);
    }

    #[test]
    fn expired_and_abandoned_jobs_never_reach_compute() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(4, true));
        queue.push(job(1, 1, "x", t0));
        let mut short = job(2, 1, "x", t0);
        short.deadline = t0 + Duration::from_millis(5);
        queue.push(short);
        queue.push(job(3, 1, "x", t0));
        let dropped = queue.drop_stale(t0 + Duration::from_millis(6), |&id| id == 3);
        assert_eq!(ids(&dropped.expired), vec![2]);
        assert_eq!(ids(&dropped.abandoned), vec![3]);
        let batch = queue.pop_batch(t0 + Duration::from_millis(20)).expect("due");
        assert_eq!(ids(&batch), vec![1]);
    }

    #[test]
    fn weighted_round_robin_shares_follow_the_weights() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(1, true));
        let weights = [("a", 1u32), ("b", 2), ("c", 4)];
        let mut next_id = 0u32;
        let mut served: HashMap<&str, usize> = HashMap::new();
        // Every tenant keeps a deep backlog; 10,000 single-row picks.
        for (tenant, weight) in weights {
            for _ in 0..50 {
                queue.push(tenant_job(next_id, 1, "x", t0, tenant, weight));
                next_id += 1;
            }
        }
        for _ in 0..10_000 {
            let batch = queue.pop_batch(t0).expect("a backlog is always due");
            let job = &batch[0];
            let tenant = weights.iter().map(|(t, _)| *t).find(|t| **t == *job.share.tenant).expect("known tenant");
            *served.entry(tenant).or_default() += 1;
            queue.push(tenant_job(next_id, 1, "x", t0, tenant, job.share.weight));
            next_id += 1;
        }
        for (tenant, weight) in weights {
            let share = served[tenant] as f64 / 10_000.0;
            let expected = f64::from(weight) / 7.0;
            assert!((share - expected).abs() <= 0.05 * expected, "{tenant}: share {share:.4}, expected {expected:.4}");
        }
    }

    #[test]
    fn a_flooding_tenant_does_not_starve_another() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy(4, true));
        for id in 0..100 {
            queue.push(tenant_job(id, 1, "x", t0, "noisy", 1));
        }
        queue.push(tenant_job(1000, 1, "x", t0 + Duration::from_millis(1), "quiet", 1));
        let first = queue.pop_batch(t0).expect("full");
        let second = queue.pop_batch(t0).expect("full");
        let served: Vec<u32> = first.iter().chain(&second).map(|j| j.payload).collect();
        assert!(served.contains(&1000), "the quiet tenant's job rides in the first batches: {served:?}");
    }

    mod fairness {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            /// Two backlogged tenants (never fewer jobs waiting than a batch can take), jobs of
            /// 1 to 8 rows: after every batch, the difference in their service (rows over
            /// weight) stays within one round's quantum plus one maximum batch.
            #[test]
            fn backlogged_tenants_are_served_by_weight_within_a_quantum_and_a_batch(
                (weight_a, weight_b) in (1u32..=8, 1u32..=8),
                max_batch in 8usize..=32,
                sizes in proptest::collection::vec((1usize..=8, 1usize..=8), 300),
            ) {
                let at = Instant::now();
                let mut queue = BatchQueue::new(policy(max_batch, true));
                let (mut next, mut id) = ((0usize, 0usize), 0u32);
                let mut refill = |queue: &mut BatchQueue<u32>, next: &mut (usize, usize)| {
                    for (tenant, weight) in [("a", weight_a), ("b", weight_b)] {
                        while queue.lanes.get(tenant).map_or(0, |lane| lane.jobs.len()) < 40 {
                            let cursor = if tenant == "a" { &mut next.0 } else { &mut next.1 };
                            let (size_a, size_b) = sizes[*cursor % sizes.len()];
                            *cursor += 1;
                            id += 1;
                            let rows = if tenant == "a" { size_a } else { size_b };
                            queue.push(tenant_job(id, rows, "k", at, tenant, weight));
                        }
                    }
                };
                let (mut served_a, mut served_b) = (0usize, 0usize);
                let bound = 1.0 + max_batch as f64 / f64::from(weight_a.min(weight_b));
                for _ in 0..1000 {
                    refill(&mut queue, &mut next);
                    let batch = queue.pop_batch(at + Duration::from_secs(1)).expect("a batch is due");
                    for job in &batch {
                        match &*job.share.tenant {
                            "a" => served_a += job.rows,
                            _ => served_b += job.rows,
                        }
                    }
                    let gap = served_a as f64 / f64::from(weight_a) - served_b as f64 / f64::from(weight_b);
                    prop_assert!(gap.abs() <= bound, "gap {gap:.2} > {bound:.2} after serving a {served_a}, b {served_b}");
                }
            }
        }
    }
}
