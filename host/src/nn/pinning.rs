//! CPU instances pinned to cores (`cpus = "2-3"`): their loads and runs happen on threads
//! whose affinity is the instance's cores, named for them, so what they compute stays there.
//! ONNX Runtime's intra-op threads are created during the load and inherit its thread's
//! affinity (and the backend runs as many as there are cores).

use std::io;
use std::sync::{Arc, mpsc};

use super::backend::{BackendError, Graph, Output, Signature, Stop};
use crate::registry::placement::{CpuList, DeviceId};
use crate::tensor::Tensor;

/// Cores `sched_setaffinity` can name in this build (glibc's `CPU_SETSIZE`).
const MAX_PINNED_CORE: usize = 1023;

/// The cores this process may run on (`None` where the system cannot say).
#[allow(unsafe_code)] // sched_getaffinity(2) into a zeroed cpu_set_t of the size passed
pub fn allowed_cores() -> Option<CpuList> {
    // SAFETY: cpu_set_t is plain data; the kernel writes at most size_of::<cpu_set_t>() bytes
    // into it, and CPU_ISSET reads inside it for indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        Some(CpuList::new((0..=MAX_PINNED_CORE).filter(|&core| libc::CPU_ISSET(core, &set)).collect()))
    }
}

/// Pin the calling thread to `cpus`.
#[allow(unsafe_code)] // sched_setaffinity(2) of the calling thread from a cpu_set_t built here
fn pin_current_thread(cpus: &CpuList) -> io::Result<()> {
    if let Some(&beyond) = cpus.cores().iter().find(|&&core| core > MAX_PINNED_CORE) {
        return Err(io::Error::other(format!(
            "core {beyond} is beyond the {} cores a thread can be pinned to",
            MAX_PINNED_CORE + 1
        )));
    }
    // SAFETY: cpu_set_t is plain data, CPU_SET writes inside it for indices checked above to
    // be below CPU_SETSIZE, and sched_setaffinity reads exactly its size; pid 0 is this thread.
    let result = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &core in cpus.cores() {
            libc::CPU_SET(core, &mut set);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The name of threads working for instances pinned to `cpus` (Linux keeps 15 bytes).
pub fn thread_name(cpus: &CpuList) -> String {
    let mut name = format!("sluice-cpu{cpus}");
    name.truncate(15);
    name
}

/// Run `work` on a new thread pinned to `cpus` and named for them, and wait for it: threads
/// it starts (an engine's pool) inherit the pinning.
pub fn on_pinned_thread<T: Send>(cpus: &CpuList, work: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|scope| {
        let pinned = std::thread::Builder::new().name(thread_name(cpus)).spawn_scoped(scope, || {
            pin_current_thread(cpus)?;
            Ok(work())
        })?;
        pinned.join().map_err(|_| io::Error::other("the pinned thread panicked"))?
    })
}

type Job = Box<dyn FnOnce() + Send>;

/// A graph whose runs happen on a thread of its own, pinned to the instance's cores; the
/// thread ends with the graph.
pub struct PinnedGraph {
    graph: Arc<dyn Graph>,
    jobs: mpsc::Sender<Job>,
}

impl PinnedGraph {
    pub fn new(graph: Box<dyn Graph>, cpus: &CpuList) -> io::Result<Self> {
        let (jobs, receiver) = mpsc::channel::<Job>();
        let (pinned, started) = mpsc::sync_channel(1);
        let cores = cpus.clone();
        std::thread::Builder::new().name(thread_name(cpus)).spawn(move || {
            let pinning = pin_current_thread(&cores);
            let ok = pinning.is_ok();
            let _ = pinned.send(pinning);
            while ok && let Ok(job) = receiver.recv() {
                job();
            }
        })?;
        started.recv().map_err(|_| io::Error::other("the pinned thread ended at once"))??;
        Ok(Self { graph: Arc::from(graph), jobs })
    }
}

impl Graph for PinnedGraph {
    fn signature(&self) -> &Signature {
        self.graph.signature()
    }

    fn device(&self) -> DeviceId {
        self.graph.device()
    }

    /// Its runs take the cores it is pinned to, which the operator gave it.
    fn shared_device(&self) -> Option<DeviceId> {
        None
    }

    fn run(&self, inputs: &mut Vec<(String, Tensor)>, stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
        let gone = || BackendError::InvalidInput("the instance's pinned thread is gone".to_string());
        let (reply, answer) = mpsc::sync_channel(1);
        let (graph, stop, mut moved) = (self.graph.clone(), stop.clone(), std::mem::take(inputs));
        self.jobs
            .send(Box::new(move || {
                let outputs = graph.run(&mut moved, &stop);
                let _ = reply.send((outputs, moved));
            }))
            .map_err(|_| gone())?;
        let (outputs, moved) = answer.recv().map_err(|_| gone())?;
        *inputs = moved;
        outputs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::ElementType;

    #[test]
    fn work_runs_on_a_named_thread_pinned_to_the_cores() {
        let allowed = allowed_cores().expect("this process's cores");
        let last = *allowed.cores().last().expect("at least one core");
        let one = CpuList::parse(&last.to_string()).expect("a core");
        let (name, cores) = on_pinned_thread(&one, || {
            (std::thread::current().name().map(str::to_string), allowed_cores().map(|c| c.cores().to_vec()))
        })
        .expect("pinned");
        assert_eq!(name.as_deref(), Some(thread_name(&one).as_str()));
        assert_eq!(cores, Some(vec![last]), "the thread runs on the named core only");
        let beyond = CpuList::parse("2000").expect("a list");
        assert!(on_pinned_thread(&beyond, || ()).is_err(), "a core past CPU_SETSIZE is refused");
    }

    /// A graph that answers the name of the thread it ran on and where its input lay.
    struct Notes(Signature);

    impl Graph for Notes {
        fn signature(&self) -> &Signature {
            &self.0
        }

        fn run(&self, inputs: &mut Vec<(String, Tensor)>, _stop: &Stop) -> Result<Vec<(String, Output)>, BackendError> {
            let thread = std::thread::current().name().unwrap_or_default().as_bytes().to_vec();
            let address = (inputs[0].1.data().as_ptr() as u64).to_le_bytes().to_vec();
            let tensor = |bytes: Vec<u8>| Tensor::new(ElementType::U8, vec![bytes.len()], bytes).expect("a tensor");
            Ok(Output::all(vec![("thread".into(), tensor(thread)), ("address".into(), tensor(address))]))
        }
    }

    #[test]
    fn a_pinned_graph_runs_on_its_thread_and_gives_the_inputs_back_as_they_were() {
        let allowed = allowed_cores().expect("this process's cores");
        let one = CpuList::parse(&allowed.cores()[0].to_string()).expect("a core");
        let pinned = PinnedGraph::new(Box::new(Notes(Signature::default())), &one).expect("a pinned thread");
        let input = Tensor::new(ElementType::F32, vec![2, 2], (0..16).collect()).expect("a tensor");
        let mut inputs = vec![("X".to_string(), input.clone())];
        let address = inputs[0].1.data().as_ptr() as u64;
        let outputs = pinned.run(&mut inputs, &Stop::default()).expect("runs");
        let data = |index: usize| outputs[index].1.view().expect("a view").data();
        assert_eq!(data(0), thread_name(&one).as_bytes(), "it ran on the pinned thread");
        assert_eq!(data(1), address.to_le_bytes(), "the engine read the caller's own buffer");
        assert_eq!(inputs, vec![("X".to_string(), input)], "the inputs came back as they were");
        assert_eq!(inputs[0].1.data().as_ptr() as u64, address, "in the same memory, for the next batch");
    }
}
