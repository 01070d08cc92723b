//! `treecast._native`: the Python binding of the treecast API (PyO3).
//!
//! Every blocking call runs its future on one tokio runtime of the module's, and
//! waits for it with the GIL released, in slices of 50 ms, checking for signals
//! between them: Ctrl-C raises `KeyboardInterrupt` at once and drops the future.
//! Every `*_async` twin spawns the same future and resolves an asyncio future from
//! the runtime's thread (`loop.call_soon_threadsafe`); cancelling it aborts the task.
//! The pure-Python package `treecast` wraps these classes.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use tokio::sync::{Mutex as AsyncMutex, RwLock};
use treecast_api::{
    ApiError, BackEnd as RustBackEnd, BackEndSender, FilterSpec, Format, Match, Network as RustNetwork,
    Packet, RankSet as RustRankSet, Stream as RustStream, StreamOptions, StreamSender, SyncMode,
    TransformKind, Value,
};

mod convert;
mod errors;

use errors::{Fail, Kind};

/// Longest a blocking call waits with the GIL released before it checks for signals.
const SLICE: Duration = Duration::from_millis(50);
/// Longest a network's shutdown takes before its processes are killed.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(15);

/// The runtime every network's tasks and every blocking call run on, made at first use.
///
/// One worker thread: a blocking call polls its own future on the caller's thread
/// (see [`wait_ticking`]), and the networks' drivers run on the worker. With two
/// workers a round trip from Python cost 1.25 times the Rust API's (median of five
/// `python bench.py` runs on 2 cores) against 1.07 times with one: the drivers'
/// frames crossed between the two workers as well.
fn runtime() -> Result<&'static tokio::runtime::Runtime, Fail> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("treecast")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Fail::new(Kind::Error, format!("cannot start treecast's threads: {e}")))
}

/// Runs `fut` on the runtime and waits for it with the GIL released, calling `tick`
/// (with the GIL) between slices; Ctrl-C (or any signal handler raising) drops it.
///
/// The future is polled on the calling thread (the runtime's `block_on`), not
/// spawned: one thread hop less per call, which is most of what a round trip from
/// Python costs over one from Rust.
fn wait_ticking<T: Send + 'static>(
    py: Python<'_>,
    fut: impl Future<Output = Result<T, Fail>> + Send + 'static,
    tick: &mut dyn FnMut(Python<'_>) -> PyResult<()>,
) -> PyResult<T> {
    let rt = runtime().map_err(|f| f.into_pyerr(py))?;
    let mut fut = Box::pin(fut);
    loop {
        let done = py.detach(|| rt.block_on(async { tokio::time::timeout(SLICE, fut.as_mut()).await }));
        if let Ok(result) = done {
            tick(py)?;
            return result.map_err(|f| f.into_pyerr(py));
        }
        py.check_signals().and_then(|()| tick(py))?;
    }
}

/// [`wait_ticking`] with nothing to do between slices.
fn wait<T: Send + 'static>(
    py: Python<'_>,
    fut: impl Future<Output = Result<T, Fail>> + Send + 'static,
) -> PyResult<T> {
    wait_ticking(py, fut, &mut |_| Ok(()))
}

/// Sets an asyncio future's result or exception, unless it is done (cancelled).
#[pyfunction]
fn _resolve(fut: &Bound<'_, PyAny>, ok: bool, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if fut.call_method0("done")?.is_truthy()? {
        return Ok(());
    }
    let method = if ok { "set_result" } else { "set_exception" };
    fut.call_method1(method, (value,))?;
    Ok(())
}

/// Aborts the task behind an asyncio future that was cancelled (its done callback).
#[pyclass]
struct Canceller {
    handle: tokio::task::AbortHandle,
}

#[pymethods]
impl Canceller {
    fn __call__(&self, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut.call_method0("cancelled")?.is_truthy()? {
            self.handle.abort();
        }
        Ok(())
    }
}

/// Whether the interpreter is shutting down, and how many of the runtime's threads
/// are calling into Python now: see [`Entered`] and `_at_exit`.
static PYTHON_CALLS: std::sync::Mutex<(bool, usize)> = std::sync::Mutex::new((false, 0));
/// Signalled when a runtime thread is done with Python.
static PYTHON_CALLS_DONE: std::sync::Condvar = std::sync::Condvar::new();

/// A runtime thread's leave to call into Python, until dropped; none once the
/// interpreter is shutting down.
struct Entered;

impl Entered {
    fn new() -> Option<Entered> {
        let mut calls = PYTHON_CALLS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if calls.0 {
            return None;
        }
        calls.1 += 1;
        Some(Entered)
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut calls = PYTHON_CALLS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        calls.1 -= 1;
        PYTHON_CALLS_DONE.notify_all();
    }
}

/// Run at exit (registered at import): no runtime thread calls into Python after it
/// returns, and those calling now finish first (a thread the interpreter stops
/// while it holds the GIL aborts the process).
#[pyfunction]
fn _at_exit(py: Python<'_>) {
    py.detach(|| {
        let mut calls = PYTHON_CALLS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        calls.0 = true;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while calls.1 > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            calls = match PYTHON_CALLS_DONE.wait_timeout(calls, left) {
                Ok((c, _)) => c,
                Err(e) => e.into_inner().0,
            };
        }
    });
}

/// Spawns `fut` and returns an asyncio future of the running loop that `convert`
/// resolves with its value, or with the exception its failure makes.
fn awaitable<'py, T: Send + 'static>(
    py: Python<'py>,
    fut: impl Future<Output = Result<T, Fail>> + Send + 'static,
    convert: fn(Python<'_>, T) -> PyResult<Py<PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let rt = runtime().map_err(|f| f.into_pyerr(py))?;
    let lp = py.import("asyncio")?.call_method0("get_running_loop")?;
    let pyfut = lp.call_method0("create_future")?;
    let (lp_owned, fut_owned) = (lp.unbind(), pyfut.clone().unbind());
    let handle = rt.spawn(async move {
        let out = fut.await;
        // Nobody awaits anything once the interpreter is shutting down; a thread
        // that took the GIL then would be stopped inside it.
        let Some(_entered) = Entered::new() else { return };
        Python::attach(|py| {
            let result = match out {
                Ok(v) => convert(py, v),
                Err(f) => Err(f.into_pyerr(py)),
            };
            let (ok, obj) = match result {
                Ok(o) => (true, o),
                Err(e) => (false, e.into_value(py).into_any()),
            };
            let setter = match wrap_pyfunction!(_resolve, py) {
                Ok(f) => f,
                Err(_) => return,
            };
            // A closed loop takes nothing: the awaiting program is gone.
            let _ = lp_owned.bind(py).call_method1("call_soon_threadsafe", (setter, fut_owned, ok, obj));
        });
    });
    pyfut.call_method1("add_done_callback", (Canceller { handle: handle.abort_handle() },))?;
    Ok(pyfut)
}

/// `None` for Python's `None`, else a time limit in seconds as a duration.
fn limit_of(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(s) if s.is_finite() && (0.0..=1e9).contains(&s) => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => {
            Err(errors::argument_error(format!("timeout={s} is not a number of seconds from 0 to 1e9")))
        }
    }
}

/// Runs `fut` within `limit`, failing with the API's timeout error.
async fn within<T>(limit: Option<Duration>, fut: impl Future<Output = Result<T, Fail>>) -> Result<T, Fail> {
    match limit {
        None => fut.await,
        Some(l) => tokio::time::timeout(l, fut).await.map_err(|_| Fail::from(ApiError::Timeout(l)))?,
    }
}

/// Runs a flush within `limit`, failing as timed out with what it waited for.
async fn flushed_within(
    limit: Option<Duration>,
    fut: impl Future<Output = Result<(), Fail>>,
) -> Result<(), Fail> {
    let Some(l) = limit else { return fut.await };
    tokio::time::timeout(l, fut).await.map_err(|_| {
        Fail::new(
            Kind::Timeout,
            format!(
                "flush: what was sent was not written out within {l:?}: a peer is not reading; \
                 give a longer timeout, or look for a stuck node in events()"
            ),
        )
    })?
}

/// Set by `close` before it waits for the handle's lock, so that a call waiting
/// without a limit (`recv()`, `next_event()`, `run()`) ends instead of keeping the
/// close waiting for ever; dropped with the handle, which ends them too.
type Closing = tokio::sync::watch::Sender<bool>;

/// Runs `fut` until `closing` is set (or dropped): then fails as closed, naming `what`.
async fn until_closed<T>(
    mut closing: tokio::sync::watch::Receiver<bool>,
    what: &str,
    fut: impl Future<Output = Result<T, Fail>>,
) -> Result<T, Fail> {
    tokio::select! {
        r = fut => r,
        _ = closing.wait_for(|c| *c) => {
            Err(Fail::new(Kind::Closed, format!("the {what} is closed: close() was called")))
        }
    }
}

// ---------------------------------------------------------------------------------
// Rank sets and host lists

/// A set of ranks, folded as `0-15,32` (the same text `treecast` prints).
#[pyclass(module = "treecast", name = "RankSet", frozen, eq)]
#[derive(Clone, PartialEq)]
struct PyRankSet {
    inner: RustRankSet,
}

#[pymethods]
impl PyRankSet {
    /// From a folded text (`"0-3,8"`), an iterable of ints, or nothing.
    #[new]
    #[pyo3(signature = (ranks = None))]
    fn new(ranks: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let mut inner = RustRankSet::new();
        if let Some(r) = ranks {
            if let Ok(text) = r.extract::<String>() {
                inner = text
                    .parse::<RustRankSet>()
                    .map_err(|e| errors::argument_error(format!("rank set {text:?}: {e}")))?;
            } else if let Ok(other) = r.cast::<PyRankSet>() {
                inner = other.get().inner.clone();
            } else {
                for item in r.try_iter()? {
                    inner.insert(item?.extract::<u32>()?);
                }
            }
        }
        Ok(PyRankSet { inner })
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("RankSet({:?})", self.inner.to_string())
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.inner.len()).unwrap_or(usize::MAX)
    }

    fn __contains__(&self, rank: i64) -> bool {
        u32::try_from(rank).is_ok_and(|r| self.inner.contains(r))
    }

    fn __iter__(&self) -> PyRankSetIter {
        // Lazy: "0-4294967295" is a valid set, and a list of it would not fit in memory.
        PyRankSetIter {
            ranges: self.inner.ranges().to_vec(),
            range: 0,
            next: self.inner.ranges().first().map(|r| r.0),
        }
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.inner.ranges().hash(&mut h);
        h.finish()
    }

    fn __bool__(&self) -> bool {
        !self.inner.is_empty()
    }

    fn __or__(&self, other: &PyRankSet) -> PyRankSet {
        let mut inner = self.inner.clone();
        inner.union_with(&other.inner);
        PyRankSet { inner }
    }

    fn __and__(&self, other: &PyRankSet) -> PyRankSet {
        PyRankSet { inner: self.inner.intersection(&other.inner) }
    }

    fn __sub__(&self, other: &PyRankSet) -> PyRankSet {
        PyRankSet { inner: self.inner.difference(&other.inner) }
    }

    /// The ranks as a sorted list.
    fn to_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // Through Python's list(): a set too large to list raises MemoryError there,
        // where a Rust Vec would abort the interpreter.
        py.import("builtins")?.getattr("list")?.call1((Py::new(py, self.__iter__())?,))
    }

    /// The ranges `(first, last)`, inclusive.
    fn ranges(&self) -> Vec<(u32, u32)> {
        self.inner.ranges().to_vec()
    }
}

/// An iterator over a rank set's ranks, range by range, without listing them.
#[pyclass(module = "treecast._native", name = "RankSetIterator")]
struct PyRankSetIter {
    ranges: Vec<(u32, u32)>,
    /// The range `next` is in.
    range: usize,
    /// The next rank to give, if any.
    next: Option<u32>,
}

#[pymethods]
impl PyRankSetIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self) -> Option<u32> {
        let rank = self.next?;
        let hi = self.ranges.get(self.range)?.1;
        self.next = if rank < hi {
            Some(rank + 1)
        } else {
            self.range += 1;
            self.ranges.get(self.range).map(|r| r.0)
        };
        Some(rank)
    }
}

/// The hosts of `include` lists minus `exclude` lists, and the warnings `treecast
/// hosts` would print.
#[pyfunction]
#[pyo3(signature = (include, exclude = Vec::new()))]
fn hosts_list(include: Vec<String>, exclude: Vec<String>) -> PyResult<(Vec<String>, Vec<String>)> {
    let inc: Vec<&str> = include.iter().map(String::as_str).collect();
    let exc: Vec<&str> = exclude.iter().map(String::as_str).collect();
    let list = treecast_topology::hostlist::HostList::new(&inc, &exc)
        .map_err(|e| Python::attach(|py| Fail::new(Kind::Format, e.to_string()).into_pyerr(py)))?;
    Ok((list.hosts, list.warnings.iter().map(ToString::to_string).collect()))
}

/// Hosts folded into ranges, as `treecast hosts` prints them.
#[pyfunction]
fn hosts_fold(hosts: Vec<String>) -> String {
    treecast_topology::hostlist::compress(&hosts)
}

// ---------------------------------------------------------------------------------
// Packets

/// One packet received: tag, source rank, stream and values.
#[pyclass(module = "treecast", name = "Packet", frozen, get_all)]
struct PyPacket {
    /// The tag its sender chose.
    tag: i32,
    /// The source rank (for a reduction, the lowest rank of the wave).
    rank: u32,
    /// The stream it came on.
    stream: u32,
    /// Its values, as Python objects (for an `eqclass` packet, `[]`).
    values: Py<PyList>,
    /// The format string of its values (`"%d %s"`): what sends them on again.
    format: String,
    /// For the output of the `eqclass` filter: `[(values, RankSet), ...]`; else None.
    eq_classes: Option<Py<PyList>>,
}

#[pymethods]
impl PyPacket {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Packet(tag={}, rank={}, stream={}, values={})",
            self.tag,
            self.rank,
            self.stream,
            self.values.bind(py).repr().map(|r| r.to_string()).unwrap_or_default()
        )
    }
}

/// The Python packet of a received one.
fn packet_to_py(py: Python<'_>, p: Packet) -> PyResult<Py<PyAny>> {
    let mut format = String::new();
    let (values, eq) = if p.is_eq_classes() {
        let classes = p.eq_classes().map_err(|e| Fail::from(e).into_pyerr(py))?;
        let list = PyList::empty(py);
        for c in classes {
            let vals = convert::values_to_py(py, &c.values)?;
            let ranks = Py::new(py, PyRankSet { inner: c.ranks })?;
            list.append(PyTuple::new(py, [vals.into_any(), ranks.into_bound(py).into_any()])?)?;
        }
        (PyList::empty(py).unbind(), Some(list.unbind()))
    } else {
        let values = p.values().map_err(|e| Fail::from(e).into_pyerr(py))?;
        format = Format::of(&values).to_string();
        (convert::values_to_py(py, &values)?.unbind(), None)
    };
    let packet =
        PyPacket { tag: p.tag(), rank: p.rank(), stream: p.stream(), values, format, eq_classes: eq };
    Ok(Py::new(py, packet)?.into_any())
}

/// Values and their format checked, for sending: Python objects into wire values.
fn values_for(format: &str, values: &Bound<'_, PyTuple>) -> PyResult<(String, Vec<Value>)> {
    let fmt = Format::parse(format)
        .map_err(|e| Python::attach(|py| Fail::from(ApiError::from(e)).into_pyerr(py)))?;
    let vals = convert::values_from_py(format, &fmt, values)?;
    Ok((format.to_owned(), vals))
}

// ---------------------------------------------------------------------------------
// Front-end

/// A running tree (the front-end's handle): created by `Network.launch`.
#[pyclass(module = "treecast._native", name = "Network", frozen)]
struct PyNetwork {
    net: Arc<RwLock<Option<RustNetwork>>>,
    closing: Closing,
    session: String,
    backends: u32,
    commnodes: u32,
}

/// The network behind `net`, or the error of a closed one.
fn open(net: &Option<RustNetwork>) -> Result<&RustNetwork, Fail> {
    net.as_ref()
        .ok_or_else(|| Fail::new(Kind::Closed, "the network is closed: close() was called".to_owned()))
}

/// The tree options `treecast run` takes, as the Python keywords give them.
#[derive(Default)]
struct TreeOptions {
    local: Option<usize>,
    hosts: Option<String>,
    exclude: Vec<String>,
    fanout: usize,
    user: Option<String>,
    per_host: usize,
    topology: Option<String>,
    launcher: Option<String>,
    ssh_args: Option<String>,
    remote_path: Option<String>,
    allow_missing: bool,
    attach: Option<PathBuf>,
    attach_timeout: f64,
    connect_timeout: Option<f64>,
    dead_after: Option<f64>,
    rejoin_within: Option<f64>,
    route: Option<String>,
}

impl TreeOptions {
    fn args(self) -> Result<treecast::apps::cli::TreeArgs, Fail> {
        use treecast::apps::cli::{LauncherKind, RouteKind, TreeArgs};
        let launcher = match self.launcher.as_deref() {
            None if self.hosts.is_some() => LauncherKind::Ssh,
            None | Some("local") => LauncherKind::Local,
            Some("ssh") => LauncherKind::Ssh,
            Some("slurm") => LauncherKind::Slurm,
            Some(other) => {
                return Err(Fail::new(
                    Kind::Value,
                    format!("launcher={other:?} is not one of \"local\", \"ssh\", \"slurm\""),
                ))
            }
        };
        Ok(TreeArgs {
            local: self.local,
            hosts: self.hosts,
            exclude: self.exclude,
            fanout: self.fanout,
            connect_timeout: self.connect_timeout,
            user: self.user,
            per_host: self.per_host,
            topology: self.topology,
            launcher,
            ssh_args: self.ssh_args,
            remote_path: self.remote_path,
            allow_missing: self.allow_missing,
            attach: self.attach,
            attach_timeout: self.attach_timeout,
            dead_after: self.dead_after,
            rejoin_within: self.rejoin_within,
            route: match self.route.as_deref() {
                None => RouteKind::Tcp,
                Some(r) => parse_route(r)?,
            },
        })
    }
}

/// What a launch needs, checked with the GIL held.
struct LaunchSpec {
    builder: treecast_api::NetworkBuilder,
}

impl LaunchSpec {
    async fn launch(self) -> Result<RustNetwork, Fail> {
        Ok(self.builder.launch().await?)
    }
}

/// The Python handle of a launched network.
fn network_to_py(py: Python<'_>, net: RustNetwork) -> PyResult<Py<PyAny>> {
    let handle = PyNetwork {
        session: net.session().to_owned(),
        backends: net.backends(),
        commnodes: net.commnodes(),
        net: Arc::new(RwLock::new(Some(net))),
        closing: tokio::sync::watch::channel(false).0,
    };
    Ok(Py::new(py, handle)?.into_any())
}

#[allow(clippy::too_many_arguments)]
fn launch_spec(
    treecast: PathBuf,
    options: TreeOptions,
    backend: Option<Vec<String>>,
    env: Option<Vec<(String, String)>>,
    plugins: Vec<PathBuf>,
) -> Result<LaunchSpec, Fail> {
    let args = options.args()?;
    let mut builder = treecast::apps::run::builder(&args, Some(&treecast))
        .map_err(|e| Fail::from_anyhow(Kind::Launch, e))?;
    if let Some(cmd) = backend {
        if cmd.is_empty() {
            return Err(Fail::new(
                Kind::Value,
                "backend=[] names no program: give argv, or None for treecast's own".into(),
            ));
        }
        builder = builder.backend_command(cmd);
    }
    for (k, v) in env.unwrap_or_default() {
        builder = builder.env(k, v);
    }
    for p in plugins {
        builder = builder.plugin(p);
    }
    Ok(LaunchSpec { builder })
}

/// The options of a stream as Python gives them.
fn stream_options(
    filter: &str,
    sync: &str,
    down: Option<&str>,
    route: Option<&str>,
) -> Result<StreamOptions, Fail> {
    let spec = |name: &str| match TransformKind::from_name(name) {
        Some(k) => k.spec(),
        // A plug-in filter loaded into the tree, by name (version 1 unless NAME@V).
        None => match name.rsplit_once('@').and_then(|(n, v)| v.parse::<u16>().ok().map(|v| (n, v))) {
            Some((n, v)) => FilterSpec::new(n, v),
            None => FilterSpec::new(name, 1),
        },
    };
    let sync = match sync {
        "wait_for_all" | "wait-for-all" => SyncMode::WaitForAll,
        "do_not_wait" | "do-not-wait" | "none" => SyncMode::DoNotWait,
        other => match other.strip_prefix("timeout:").and_then(|ms| ms.parse::<u32>().ok()) {
            Some(ms) => SyncMode::TimeOut(ms),
            None => {
                return Err(Fail::new(
                    Kind::Value,
                    format!("sync={other:?} is not \"wait_for_all\", \"do_not_wait\" or \"timeout:MS\""),
                ))
            }
        },
    };
    let route = match route {
        None => treecast_api::RouteChoice::Network,
        Some(r) => parse_route(r)?,
    };
    Ok(StreamOptions {
        sync,
        up: spec(filter),
        down: spec(down.unwrap_or("null")),
        route,
        ..StreamOptions::default()
    })
}

/// A `route=` argument, of a network (`RouteKind`) or of a stream (`RouteChoice`).
fn parse_route<R: std::str::FromStr<Err = String>>(r: &str) -> Result<R, Fail> {
    r.parse().map_err(|e: String| Fail::new(Kind::Value, format!("route={r:?}: {e}")))
}

/// What `run` found, as Python sees it.
fn run_report_to_py(py: Python<'_>, r: treecast::apps::run::RunReport) -> PyResult<Py<PyAny>> {
    let d = PyDict::new(py);
    let classes = PyList::empty(py);
    for c in &r.classes {
        let cd = PyDict::new(py);
        let ranks: RustRankSet = c.ranks.parse().unwrap_or_default();
        cd.set_item("ranks", Py::new(py, PyRankSet { inner: ranks })?)?;
        cd.set_item("stdout", PyBytes::new(py, &c.stdout))?;
        cd.set_item("stderr", PyBytes::new(py, &c.stderr))?;
        cd.set_item("stdout_bytes", c.stdout_bytes)?;
        cd.set_item("stderr_bytes", c.stderr_bytes)?;
        cd.set_item("exit_code", c.exit_code)?;
        cd.set_item("signal", c.signal)?;
        cd.set_item("status", c.status())?;
        cd.set_item("hosts", &c.hosts)?;
        classes.append(cd)?;
    }
    d.set_item("classes", classes)?;
    let lost_list = |lost: &[treecast::apps::run::Lost]| -> PyResult<Bound<'_, PyList>> {
        let l = PyList::empty(py);
        for x in lost {
            let ranks: RustRankSet = x.ranks.parse().unwrap_or_default();
            l.append((Py::new(py, PyRankSet { inner: ranks })?, x.reason.clone()))?;
        }
        Ok(l)
    };
    d.set_item("lost", lost_list(&r.lost)?)?;
    d.set_item("no_answer", lost_list(&r.no_answer)?)?;
    d.set_item("failed_hosts", r.failed_hosts())?;
    d.set_item("ok", r.ok)?;
    d.set_item("max_status", r.exit_status)?;
    d.set_item("backends", r.backends)?;
    Ok(d.into_any().unbind())
}

/// The global clock table as a list of dicts, one per node.
fn clock_to_py(py: Python<'_>, table: Vec<treecast_api::NodeClock>) -> PyResult<Py<PyAny>> {
    let out = PyList::empty(py);
    for c in table {
        let d = PyDict::new(py);
        d.set_item("node_id", c.node_id)?;
        d.set_item("name", c.name)?;
        d.set_item("offset_ns", c.offset_ns)?;
        d.set_item("drift_ppm", c.drift_ppm)?;
        d.set_item("error_ns", c.error_ns)?;
        d.set_item("rtt_ns", c.rtt_ns)?;
        d.set_item("age_s", c.age_s)?;
        d.set_item("rounds", c.rounds)?;
        out.append(d)?;
    }
    Ok(out.into_any().unbind())
}

/// An event of the network as a dict: `kind`, `message` and the fields it has.
fn event_to_py(py: Python<'_>, e: treecast_api::Event) -> PyResult<Py<PyAny>> {
    use treecast_api::Event as E;
    let d = PyDict::new(py);
    d.set_item("message", e.to_string())?;
    let rs = |r: &RustRankSet| Py::new(py, PyRankSet { inner: r.clone() });
    match &e {
        E::RanksLost { ranks, reason } => {
            d.set_item("kind", "ranks_lost")?;
            d.set_item("ranks", rs(ranks)?)?;
            d.set_item("reason", reason)?;
        }
        E::NodeLost { node, ranks, reason } => {
            d.set_item("kind", "node_lost")?;
            d.set_item("node", node)?;
            d.set_item("ranks", rs(ranks)?)?;
            d.set_item("reason", reason)?;
        }
        E::RanksRejoined { ranks, parent } => {
            d.set_item("kind", "ranks_rejoined")?;
            d.set_item("ranks", rs(ranks)?)?;
            d.set_item("parent", parent)?;
        }
        E::RanksJoined { ranks } => {
            d.set_item("kind", "ranks_joined")?;
            d.set_item("ranks", rs(ranks)?)?;
        }
        E::RanksLeft { ranks, reason } => {
            d.set_item("kind", "ranks_left")?;
            d.set_item("ranks", rs(ranks)?)?;
            d.set_item("reason", reason)?;
        }
        E::FilterError { stream, rank, message } => {
            d.set_item("kind", "filter_error")?;
            d.set_item("stream", stream)?;
            d.set_item("rank", rank)?;
            d.set_item("reason", message)?;
        }
        E::StreamRefused { stream, node, message } => {
            d.set_item("kind", "stream_refused")?;
            d.set_item("stream", stream)?;
            d.set_item("node", node)?;
            d.set_item("reason", message)?;
        }
        E::MessageUndeliverable { from, to } => {
            d.set_item("kind", "message_undeliverable")?;
            d.set_item("rank", from)?;
            d.set_item("ranks", rs(to)?)?;
        }
        E::NetworkClosed { index, reason } => {
            d.set_item("kind", "network_closed")?;
            d.set_item("index", index)?;
            d.set_item("reason", reason)?;
        }
        _ => d.set_item("kind", "other")?,
    }
    Ok(d.into_any().unbind())
}

fn none(py: Python<'_>, (): ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

fn stream_to_py(py: Python<'_>, s: RustStream) -> PyResult<Py<PyAny>> {
    let sender = s.sender();
    let id = s.id();
    let ranks = PyRankSet { inner: s.communicator().ranks().clone() };
    let stream = Arc::new(AsyncMutex::new(Some(s)));
    let closing = tokio::sync::watch::channel(false).0;
    Ok(Py::new(py, PyStream { id, sender, ranks, stream, closing })?.into_any())
}

async fn open_stream(
    net: Arc<RwLock<Option<RustNetwork>>>,
    options: StreamOptions,
    ranks: Option<RustRankSet>,
) -> Result<RustStream, Fail> {
    let guard = net.read().await;
    let n = open(&guard)?;
    let comm = match ranks {
        Some(r) => n.communicator(r)?,
        None => n.broadcast_communicator(),
    };
    Ok(n.new_stream(&comm, options).await?)
}

async fn run_on(
    net: Arc<RwLock<Option<RustNetwork>>>,
    command: Vec<String>,
    limit: Option<Duration>,
    output_limit: u64,
) -> Result<treecast::apps::run::RunReport, Fail> {
    // A read lock: events, the clock and streams stay usable from other threads meanwhile.
    let guard = net.read().await;
    let n = open(&guard)?;
    treecast::apps::run::run_command_keeping(n, &command, limit, output_limit)
        .await
        .map_err(|e| Fail::from_anyhow(Kind::Error, e))
}

async fn close_network(net: Arc<RwLock<Option<RustNetwork>>>) -> Result<(), Fail> {
    // Calls in flight end once `closing` is set, but one paused in its wait (a
    // bcast_file whose progress callback calls close()) holds the lock until it
    // goes on: a bounded wait, not a hang.
    let mut guard = tokio::time::timeout(SHUTDOWN_LIMIT, net.write()).await.map_err(|_| {
        Fail::new(
            Kind::Error,
            format!(
                "close: the network is still in use after {SHUTDOWN_LIMIT:?} by a call that does not end \
                 (close() called from a bcast_file progress callback?); close it once that call returned"
            ),
        )
    })?;
    let taken = guard.take();
    drop(guard);
    if let Some(n) = taken {
        n.shutdown_with(SHUTDOWN_LIMIT).await;
    }
    Ok(())
}

async fn next_event(
    net: Arc<RwLock<Option<RustNetwork>>>,
    limit: Option<Duration>,
) -> Result<Option<treecast_api::Event>, Fail> {
    let guard = net.read().await;
    let n = open(&guard)?;
    match limit {
        None => Ok(n.next_event().await),
        Some(l) => Ok(tokio::time::timeout(l, n.next_event()).await.ok().flatten()),
    }
}

fn event_or_none(py: Python<'_>, e: Option<treecast_api::Event>) -> PyResult<Py<PyAny>> {
    match e {
        Some(e) => event_to_py(py, e),
        None => Ok(py.None()),
    }
}

async fn spawn_on(
    net: Arc<RwLock<Option<RustNetwork>>>,
    n: u32,
    cmd: Vec<String>,
) -> Result<RustRankSet, Fail> {
    let guard = net.read().await;
    let g = open(&guard)?.spawn(n, &cmd, &treecast_api::SpawnOptions::default()).await?;
    Ok(g.rank_set())
}

fn rankset_to_py(py: Python<'_>, r: RustRankSet) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, PyRankSet { inner: r })?.into_any())
}

/// What the progress callback of `bcast_file` is told: bytes sent, and size.
type ProgressTx = tokio::sync::mpsc::Sender<(u64, u64)>;

async fn bcast_on(
    net: Arc<RwLock<Option<RustNetwork>>>,
    src: PathBuf,
    dst: Option<PathBuf>,
    mode: treecast_files::WriteMode,
    ranks: Option<RustRankSet>,
    progress: Option<ProgressTx>,
) -> Result<treecast_files::FileReport, Fail> {
    use treecast_files::{FileEntry, FileOptions, Progress};
    let guard = net.read().await;
    let n = open(&guard)?;
    let comm = match ranks {
        Some(r) => n.communicator(r)?,
        None => n.broadcast_communicator(),
    };
    let entry = FileEntry::file(src, dst);
    let options = FileOptions { mode, ..FileOptions::default() };
    let mut reports = treecast_files::bcast_files(n, &comm, &[entry], &options, |p| {
        if let (Some(tx), Progress::Sent { sent, size, .. }) = (&progress, p) {
            // Progress is advice: a callback that lags loses steps, not the transfer.
            let _ = tx.try_send((sent, size));
        }
    })
    .await?;
    reports.pop().ok_or_else(|| Fail::new(Kind::Error, "the transfer gave no report".to_owned()))
}

fn file_report_to_py(py: Python<'_>, r: treecast_files::FileReport) -> PyResult<Py<PyAny>> {
    let d = PyDict::new(py);
    d.set_item("ok", r.ok())?;
    d.set_item("source", r.source.to_string_lossy().into_owned())?;
    d.set_item("destination", r.destination.to_string_lossy().into_owned())?;
    d.set_item("size", r.size)?;
    d.set_item("hash", &r.hash)?;
    d.set_item("receivers", Py::new(py, PyRankSet { inner: r.receivers.clone() })?)?;
    let outcomes = PyList::empty(py);
    for o in &r.outcomes {
        outcomes.append((
            o.outcome.word(),
            o.detail.clone(),
            Py::new(py, PyRankSet { inner: o.ranks.clone() })?,
        ))?;
    }
    d.set_item("outcomes", outcomes)?;
    let lost = PyList::empty(py);
    for (ranks, why) in &r.lost {
        lost.append((Py::new(py, PyRankSet { inner: ranks.clone() })?, why.clone()))?;
    }
    d.set_item("lost", lost)?;
    d.set_item("elapsed", r.elapsed.as_secs_f64())?;
    Ok(d.into_any().unbind())
}

fn write_mode(mode: &str) -> PyResult<treecast_files::WriteMode> {
    use treecast_files::WriteMode;
    [WriteMode::Leave, WriteMode::Overwrite, WriteMode::Newer]
        .into_iter()
        .find(|m| m.name() == mode)
        .ok_or_else(|| {
            errors::argument_error(format!("mode={mode:?} is not \"leave\", \"overwrite\" or \"newer\""))
        })
}

#[pymethods]
impl PyNetwork {
    /// Starts a tree and waits until every process reported (blocking).
    #[staticmethod]
    #[pyo3(signature = (treecast, *, local=None, hosts=None, exclude=Vec::new(), fanout=16, user=None, per_host=1,
        topology=None, launcher=None, ssh_args=None, remote_path=None, allow_missing=false, attach=None,
        attach_timeout=300.0, connect_timeout=None, dead_after=None, rejoin_within=None, route=None, backend=None, env=None,
        plugins=Vec::new(), is_async=false))]
    #[allow(clippy::too_many_arguments)]
    fn launch<'py>(
        py: Python<'py>,
        treecast: PathBuf,
        local: Option<usize>,
        hosts: Option<String>,
        exclude: Vec<String>,
        fanout: usize,
        user: Option<String>,
        per_host: usize,
        topology: Option<String>,
        launcher: Option<String>,
        ssh_args: Option<String>,
        remote_path: Option<String>,
        allow_missing: bool,
        attach: Option<PathBuf>,
        attach_timeout: f64,
        connect_timeout: Option<f64>,
        dead_after: Option<f64>,
        rejoin_within: Option<f64>,
        route: Option<String>,
        backend: Option<Vec<String>>,
        env: Option<Vec<(String, String)>>,
        plugins: Vec<PathBuf>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options = TreeOptions {
            local,
            hosts,
            exclude,
            fanout,
            user,
            per_host,
            topology,
            launcher,
            ssh_args,
            remote_path,
            allow_missing,
            attach,
            attach_timeout,
            connect_timeout,
            dead_after,
            rejoin_within,
            route,
        };
        let spec = launch_spec(treecast, options, backend, env, plugins).map_err(|f| f.into_pyerr(py))?;
        if is_async {
            return awaitable(py, spec.launch(), network_to_py);
        }
        let net = wait(py, spec.launch())?;
        Ok(network_to_py(py, net)?.into_bound(py))
    }

    /// The session id every process of the tree carries.
    #[getter]
    fn session(&self) -> &str {
        &self.session
    }

    /// Back-ends at launch.
    #[getter]
    fn backends(&self) -> u32 {
        self.backends
    }

    /// Comm nodes at launch.
    #[getter]
    fn commnodes(&self) -> u32 {
        self.commnodes
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.net.try_read().map(|g| g.is_none()).unwrap_or(false)
    }

    /// Runs `command` on every back-end; a dict of classes, lost ranks and status.
    #[pyo3(signature = (command, timeout=None, output_limit=65536, is_async=false))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        command: Vec<String>,
        timeout: Option<f64>,
        output_limit: u64,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if command.is_empty() {
            return Err(Fail::new(Kind::Value, "run([]) names no command".to_owned()).into_pyerr(py));
        }
        let limit = limit_of(timeout)?;
        let fut = self.until_closed(run_on(self.net.clone(), command, limit, output_limit));
        if is_async {
            return awaitable(py, fut, run_report_to_py);
        }
        let r = wait(py, fut)?;
        Ok(run_report_to_py(py, r)?.into_bound(py))
    }

    /// Opens a stream to `ranks` (all back-ends when None), its frames on `route`
    /// (tcp, udp, striped; None: the network's).
    #[pyo3(signature = (filter="null", sync="wait_for_all", ranks=None, down_filter=None, route=None, is_async=false))]
    #[allow(clippy::too_many_arguments)]
    fn stream<'py>(
        &self,
        py: Python<'py>,
        filter: &str,
        sync: &str,
        ranks: Option<&Bound<'py, PyAny>>,
        down_filter: Option<&str>,
        route: Option<&str>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options = stream_options(filter, sync, down_filter, route).map_err(|f| f.into_pyerr(py))?;
        let ranks = ranks.map(|r| PyRankSet::new(Some(r)).map(|s| s.inner)).transpose()?;
        let fut = self.until_closed(open_stream(self.net.clone(), options, ranks));
        if is_async {
            return awaitable(py, fut, stream_to_py);
        }
        let s = wait(py, fut)?;
        Ok(stream_to_py(py, s)?.into_bound(py))
    }

    /// Sends `src` to every back-end (or `ranks`), written at `dst`; `progress(sent,
    /// size)` is called from this thread as chunks go.
    #[pyo3(signature = (src, dst=None, progress=None, mode="leave", ranks=None, is_async=false))]
    #[allow(clippy::too_many_arguments)]
    fn bcast_file<'py>(
        &self,
        py: Python<'py>,
        src: PathBuf,
        dst: Option<PathBuf>,
        progress: Option<Py<PyAny>>,
        mode: &str,
        ranks: Option<&Bound<'py, PyAny>>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mode = write_mode(mode)?;
        let ranks = ranks.map(|r| PyRankSet::new(Some(r)).map(|s| s.inner)).transpose()?;
        if is_async {
            let fut = self.until_closed(bcast_on(self.net.clone(), src, dst, mode, ranks, None));
            return awaitable(py, fut, file_report_to_py);
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, u64)>(64);
        let tx = progress.as_ref().map(|_| tx);
        let fut = self.until_closed(bcast_on(self.net.clone(), src, dst, mode, ranks, tx));
        let mut tick = |py: Python<'_>| -> PyResult<()> {
            while let Ok((sent, size)) = rx.try_recv() {
                if let Some(cb) = &progress {
                    cb.call1(py, (sent, size))?;
                }
            }
            Ok(())
        };
        let r = wait_ticking(py, fut, &mut tick)?;
        Ok(file_report_to_py(py, r)?.into_bound(py))
    }

    /// Starts `n` more back-ends running `command` (the launch's when empty); their ranks.
    #[pyo3(signature = (n, command=Vec::new(), is_async=false))]
    fn spawn<'py>(
        &self,
        py: Python<'py>,
        n: u32,
        command: Vec<String>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.until_closed(spawn_on(self.net.clone(), n, command));
        if is_async {
            return awaitable(py, fut, rankset_to_py);
        }
        let r = wait(py, fut)?;
        Ok(rankset_to_py(py, r)?.into_bound(py))
    }

    /// The events that happened so far (lost ranks, rejoins, filter errors), as dicts.
    fn events(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let guard = self.net.try_read().map_err(|_| {
            Fail::new(Kind::Closed, "the network is being closed: close() was called".to_owned())
                .into_pyerr(py)
        })?;
        let n = open(&guard).map_err(|f| f.into_pyerr(py))?;
        let mut out = Vec::new();
        while let Some(e) = n.try_event() {
            out.push(event_to_py(py, e)?);
        }
        Ok(out)
    }

    /// The next event, waiting up to `timeout` seconds (None: until one comes); None
    /// when none came or the network ended by itself; `NetworkClosed` when the tool
    /// closed it meanwhile.
    #[pyo3(signature = (timeout=None, is_async=false))]
    fn next_event<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.until_closed(next_event(self.net.clone(), limit_of(timeout)?));
        if is_async {
            return awaitable(py, fut, event_or_none);
        }
        let e = wait(py, fut)?;
        Ok(event_or_none(py, e)?.into_bound(py))
    }

    /// Waits until everything sent so far is written out to the links, `timeout`
    /// seconds at most (None: no limit): a peer that stops reading never lets it end.
    #[pyo3(signature = (timeout=60.0, is_async=false))]
    fn flush<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let limit = limit_of(timeout)?;
        let net = self.net.clone();
        let fut = self.until_closed(flushed_within(limit, async move {
            let guard = net.read().await;
            open(&guard)?.flush().await;
            Ok(())
        }));
        if is_async {
            return awaitable(py, fut, none);
        }
        wait(py, fut)?;
        Ok(py.None().into_bound(py))
    }

    /// Every node's clock against the front-end's, as dicts.
    fn clock(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let guard = self.net.try_read().map_err(|_| {
            Fail::new(Kind::Closed, "the network is being closed: close() was called".to_owned())
                .into_pyerr(py)
        })?;
        let n = open(&guard).map_err(|f| f.into_pyerr(py))?;
        clock_to_py(py, n.clock())
    }

    /// Waits until every reachable node's clock was measured in `rounds` rounds (2
    /// gives the drift), `timeout` seconds at most; then the table as `clock` gives it.
    #[pyo3(signature = (rounds=2, timeout=30.0, is_async=false))]
    fn wait_clock<'py>(
        &self,
        py: Python<'py>,
        rounds: i64,
        timeout: f64,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let rounds = u32::try_from(rounds)
            .ok()
            .filter(|&r| r >= 1)
            .ok_or_else(|| errors::argument_error(format!("rounds={rounds} is not a count from 1 up")))?;
        let limit = limit_of(Some(timeout))?.unwrap_or_default();
        let net = self.net.clone();
        let fut = self.until_closed(async move {
            let guard = net.read().await;
            Ok(open(&guard)?.wait_clock(rounds, limit).await?)
        });
        if is_async {
            return awaitable(py, fut, clock_to_py);
        }
        let table = wait(py, fut)?;
        Ok(clock_to_py(py, table)?.into_bound(py))
    }

    /// Ranks lost so far.
    fn lost_ranks(&self, py: Python<'_>) -> PyResult<PyRankSet> {
        let guard = self.net.try_read().map_err(|_| {
            Fail::new(Kind::Closed, "the network is being closed: close() was called".to_owned())
                .into_pyerr(py)
        })?;
        Ok(PyRankSet { inner: open(&guard).map_err(|f| f.into_pyerr(py))?.lost_ranks() })
    }

    /// Shuts the tree down and waits for its processes; again: nothing.
    #[pyo3(signature = (is_async=false))]
    fn close<'py>(&self, py: Python<'py>, is_async: bool) -> PyResult<Bound<'py, PyAny>> {
        self.closing.send_replace(true);
        let fut = close_network(self.net.clone());
        if is_async {
            return awaitable(py, fut, none);
        }
        wait(py, fut)?;
        Ok(py.None().into_bound(py))
    }
}

impl PyNetwork {
    /// `fut`, ended as closed when `close` is called meanwhile.
    fn until_closed<T: 'static>(
        &self,
        fut: impl Future<Output = Result<T, Fail>> + Send + 'static,
    ) -> impl Future<Output = Result<T, Fail>> + Send + 'static {
        until_closed(self.closing.subscribe(), "network", fut)
    }
}

impl Drop for PyNetwork {
    /// A network dropped open is shut down on the runtime (its processes do not outlive it).
    fn drop(&mut self) {
        if let Ok(rt) = runtime() {
            let net = self.net.clone();
            rt.spawn(async move {
                let _ = close_network(net).await;
            });
        }
    }
}

// ---------------------------------------------------------------------------------
// Streams

/// A stream of a network: sends down, receives reductions.
#[pyclass(module = "treecast._native", name = "Stream", frozen)]
struct PyStream {
    id: u32,
    sender: StreamSender,
    ranks: PyRankSet,
    stream: Arc<AsyncMutex<Option<RustStream>>>,
    closing: Closing,
}

async fn recv_stream(
    stream: Arc<AsyncMutex<Option<RustStream>>>,
    limit: Option<Duration>,
    only: Match,
) -> Result<Packet, Fail> {
    let mut guard = stream.lock().await;
    let s = guard
        .as_mut()
        .ok_or_else(|| Fail::new(Kind::Closed, "the stream is closed: close() was called".into()))?;
    within(limit, async { Ok(s.recv_matching(only).await?) }).await
}

async fn close_stream(stream: Arc<AsyncMutex<Option<RustStream>>>) -> Result<(), Fail> {
    let taken = stream.lock().await.take();
    if let Some(s) = taken {
        // A tree that takes nothing more is left as it is.
        let _ = tokio::time::timeout(Duration::from_secs(10), s.close()).await;
    }
    Ok(())
}

impl PyStream {
    fn send_impl<'py>(
        &self,
        py: Python<'py>,
        tag: i32,
        fmt: &str,
        values: &Bound<'py, PyTuple>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (fmt, vals) = values_for(fmt, values)?;
        let sender = self.sender.clone();
        // The stream lives until its send is done, even if Python drops it at once
        // (`net.stream().send(...)`): dropping a stream closes it.
        let keep = self.stream.clone();
        let fut = async move {
            let sent = sender.send(tag, &fmt, &vals).await;
            drop(keep);
            Ok::<(), Fail>(sent?)
        };
        if is_async {
            return awaitable(py, fut, none);
        }
        wait(py, fut)?;
        Ok(py.None().into_bound(py))
    }

    #[allow(clippy::too_many_arguments)]
    fn send_to_impl<'py>(
        &self,
        py: Python<'py>,
        rank: u32,
        tag: i32,
        fmt: &str,
        values: &Bound<'py, PyTuple>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (fmt, vals) = values_for(fmt, values)?;
        let sender = self.sender.clone();
        let keep = self.stream.clone();
        let fut = async move {
            let sent = sender.send_to(rank, tag, &fmt, &vals).await;
            drop(keep);
            Ok::<(), Fail>(sent?)
        };
        if is_async {
            return awaitable(py, fut, none);
        }
        wait(py, fut)?;
        Ok(py.None().into_bound(py))
    }

    fn recv_impl<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        only: Match,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = until_closed(
            self.closing.subscribe(),
            "stream",
            recv_stream(self.stream.clone(), limit_of(timeout)?, only),
        );
        if is_async {
            return awaitable(py, fut, packet_to_py);
        }
        let p = wait(py, fut)?;
        Ok(packet_to_py(py, p)?.into_bound(py))
    }

    fn close_impl<'py>(&self, py: Python<'py>, is_async: bool) -> PyResult<Bound<'py, PyAny>> {
        self.closing.send_replace(true);
        let fut = close_stream(self.stream.clone());
        if is_async {
            return awaitable(py, fut, none);
        }
        wait(py, fut)?;
        Ok(py.None().into_bound(py))
    }
}

#[pymethods]
impl PyStream {
    /// The stream's id.
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    /// The back-ends it reaches.
    #[getter]
    fn ranks(&self) -> PyRankSet {
        self.ranks.clone()
    }

    /// Multicasts `values` typed by `fmt` to the stream's back-ends.
    #[pyo3(signature = (tag, fmt, *values))]
    fn send<'py>(&self, py: Python<'py>, tag: i32, fmt: &str, values: &Bound<'py, PyTuple>) -> PyResult<()> {
        self.send_impl(py, tag, fmt, values, false).map(drop)
    }

    /// Awaitable `send`.
    #[pyo3(signature = (tag, fmt, *values))]
    fn send_async<'py>(
        &self,
        py: Python<'py>,
        tag: i32,
        fmt: &str,
        values: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.send_impl(py, tag, fmt, values, true)
    }

    /// Sends to one rank of the stream only.
    #[pyo3(signature = (rank, tag, fmt, *values))]
    fn send_to<'py>(
        &self,
        py: Python<'py>,
        rank: u32,
        tag: i32,
        fmt: &str,
        values: &Bound<'py, PyTuple>,
    ) -> PyResult<()> {
        self.send_to_impl(py, rank, tag, fmt, values, false).map(drop)
    }

    /// Awaitable `send_to`.
    #[pyo3(signature = (rank, tag, fmt, *values))]
    fn send_to_async<'py>(
        &self,
        py: Python<'py>,
        rank: u32,
        tag: i32,
        fmt: &str,
        values: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.send_to_impl(py, rank, tag, fmt, values, true)
    }

    /// The next packet (a reduction of a wave); `timeout` seconds at most (None: no
    /// limit). With `tag` or `rank`, the next packet with that tag or from that rank:
    /// the packets it skips wait, in order, for later receives.
    #[pyo3(signature = (timeout=None, *, tag=None, rank=None))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        tag: Option<i32>,
        rank: Option<u32>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.recv_impl(py, timeout, Match { tag, rank, stream: None }, false)
    }

    /// Awaitable `recv`.
    #[pyo3(signature = (timeout=None, *, tag=None, rank=None))]
    fn recv_async<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        tag: Option<i32>,
        rank: Option<u32>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.recv_impl(py, timeout, Match { tag, rank, stream: None }, true)
    }

    /// Closes the stream at every node; again: nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.close_impl(py, false).map(drop)
    }

    /// Awaitable `close`.
    fn close_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.close_impl(py, true)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("Stream(id={}, ranks={:?})", self.id, self.ranks.inner.to_string())
    }
}

// ---------------------------------------------------------------------------------
// Back-ends

/// A back-end's place in the tree: receives packets, sends up.
#[pyclass(module = "treecast._native", name = "BackEnd", frozen)]
struct PyBackEnd {
    rank: u32,
    size: u32,
    sender: BackEndSender,
    be: Arc<AsyncMutex<Option<RustBackEnd>>>,
    closing: Closing,
}

/// A back-end's side of one stream: what a received packet can be answered on.
#[pyclass(module = "treecast._native", name = "BackEndStream", frozen)]
struct PyBackEndStream {
    id: u32,
    sender: BackEndSender,
}

impl PyBackEndStream {
    fn send_impl<'py>(
        &self,
        py: Python<'py>,
        tag: i32,
        fmt: &str,
        values: &Bound<'py, PyTuple>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (fmt, vals) = values_for(fmt, values)?;
        let (sender, id) = (self.sender.clone(), self.id);
        let fut = async move { Ok::<(), Fail>(sender.send(id, tag, &fmt, &vals).await?) };
        if is_async {
            return awaitable(py, fut, none);
        }
        wait(py, fut)?;
        Ok(py.None().into_bound(py))
    }
}

#[pymethods]
impl PyBackEndStream {
    /// The stream's id.
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    /// Sends `values` typed by `fmt` up this stream.
    #[pyo3(signature = (tag, fmt, *values))]
    fn send<'py>(&self, py: Python<'py>, tag: i32, fmt: &str, values: &Bound<'py, PyTuple>) -> PyResult<()> {
        self.send_impl(py, tag, fmt, values, false).map(drop)
    }

    /// Awaitable `send`.
    #[pyo3(signature = (tag, fmt, *values))]
    fn send_async<'py>(
        &self,
        py: Python<'py>,
        tag: i32,
        fmt: &str,
        values: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.send_impl(py, tag, fmt, values, true)
    }

    fn __repr__(&self) -> String {
        format!("BackEndStream(id={})", self.id)
    }
}

async fn connect_backend(attach: Option<PathBuf>, rank: Option<u32>) -> Result<RustBackEnd, Fail> {
    Ok(match attach {
        Some(path) => RustBackEnd::attach(Some(&path), rank).await?,
        None => RustBackEnd::connect().await?,
    })
}

fn backend_of(be: RustBackEnd) -> PyBackEnd {
    PyBackEnd {
        rank: be.rank(),
        size: be.size(),
        sender: be.sender(),
        be: Arc::new(AsyncMutex::new(Some(be))),
        closing: tokio::sync::watch::channel(false).0,
    }
}

fn backend_to_py(py: Python<'_>, be: RustBackEnd) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, backend_of(be))?.into_any())
}

async fn recv_backend(
    be: Arc<AsyncMutex<Option<RustBackEnd>>>,
    limit: Option<Duration>,
    only: Match,
) -> Result<Packet, Fail> {
    let mut guard = be.lock().await;
    let b = guard
        .as_mut()
        .ok_or_else(|| Fail::new(Kind::Closed, "the back-end is closed: close() was called".into()))?;
    within(limit, async { Ok(b.recv_matching(only).await?) }).await
}

async fn close_backend(be: Arc<AsyncMutex<Option<RustBackEnd>>>) -> Result<(), Fail> {
    let taken = be.lock().await.take();
    if let Some(b) = taken {
        let _ = tokio::time::timeout(Duration::from_secs(10), b.close()).await;
    }
    Ok(())
}

/// A received packet with its stream, for a back-end: `(BackEndStream, Packet)`.
struct Received {
    packet: Packet,
    sender: BackEndSender,
}

fn received_to_py(py: Python<'_>, r: Received) -> PyResult<Py<PyAny>> {
    let stream = Py::new(py, PyBackEndStream { id: r.packet.stream(), sender: r.sender })?;
    let packet = packet_to_py(py, r.packet)?;
    Ok(PyTuple::new(py, [stream.into_any(), packet])?.into_any().unbind())
}

impl PyBackEnd {
    fn recv_impl<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        only: Match,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (be, sender) = (self.be.clone(), self.sender.clone());
        let limit = limit_of(timeout)?;
        let packet = until_closed(self.closing.subscribe(), "back-end", recv_backend(be, limit, only));
        let fut = async move { Ok(Received { packet: packet.await?, sender }) };
        if is_async {
            return awaitable(py, fut, received_to_py);
        }
        let r = wait(py, fut)?;
        Ok(received_to_py(py, r)?.into_bound(py))
    }

    fn flush_impl<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        is_async: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sender = self.sender.clone();
        let flushed = flushed_within(limit_of(timeout)?, async move {
            sender.flush().await;
            Ok(())
        });
        let fut = until_closed(self.closing.subscribe(), "back-end", flushed);
        if is_async {
            return awaitable(py, fut, none);
        }
        wait(py, fut)?;
        Ok(py.None().into_bound(py))
    }

    fn close_impl<'py>(&self, py: Python<'py>, is_async: bool) -> PyResult<Bound<'py, PyAny>> {
        self.closing.send_replace(true);
        let fut = close_backend(self.be.clone());
        if is_async {
            return awaitable(py, fut, none);
        }
        wait(py, fut)?;
        Ok(py.None().into_bound(py))
    }
}

#[pymethods]
impl PyBackEnd {
    /// Joins the tree (blocking): as a back-end the tree launched (no `attach`), or
    /// through the attach file `attach` (rank from `rank` or the MPI/Slurm variables).
    #[new]
    #[pyo3(signature = (attach=None, rank=None))]
    fn new(py: Python<'_>, attach: Option<PathBuf>, rank: Option<u32>) -> PyResult<Self> {
        let be = wait(py, connect_backend(attach, rank))?;
        Ok(backend_of(be))
    }

    /// Awaitable constructor: `await BackEnd.connect_async()`.
    #[staticmethod]
    #[pyo3(signature = (attach=None, rank=None))]
    fn connect_async(
        py: Python<'_>,
        attach: Option<PathBuf>,
        rank: Option<u32>,
    ) -> PyResult<Bound<'_, PyAny>> {
        awaitable(py, connect_backend(attach, rank), backend_to_py)
    }

    /// This back-end's rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    /// Back-ends in the network.
    #[getter]
    fn size(&self) -> u32 {
        self.size
    }

    /// The next packet of any stream, with that stream: `(stream, packet)`. With
    /// `stream`, `tag` or `rank`, the next packet that has them: the packets it skips
    /// wait, in order, for later receives.
    #[pyo3(signature = (timeout=None, *, stream=None, tag=None, rank=None))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        stream: Option<u32>,
        tag: Option<i32>,
        rank: Option<u32>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.recv_impl(py, timeout, Match { stream, tag, rank }, false)
    }

    /// Awaitable `recv`.
    #[pyo3(signature = (timeout=None, *, stream=None, tag=None, rank=None))]
    fn recv_async<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        stream: Option<u32>,
        tag: Option<i32>,
        rank: Option<u32>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.recv_impl(py, timeout, Match { stream, tag, rank }, true)
    }

    /// Sends up stream `stream` (an id).
    #[pyo3(signature = (stream, tag, fmt, *values))]
    fn send(
        &self,
        py: Python<'_>,
        stream: u32,
        tag: i32,
        fmt: &str,
        values: &Bound<'_, PyTuple>,
    ) -> PyResult<()> {
        PyBackEndStream { id: stream, sender: self.sender.clone() }
            .send_impl(py, tag, fmt, values, false)
            .map(drop)
    }

    /// Awaitable `send`.
    #[pyo3(signature = (stream, tag, fmt, *values))]
    fn send_async<'py>(
        &self,
        py: Python<'py>,
        stream: u32,
        tag: i32,
        fmt: &str,
        values: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        PyBackEndStream { id: stream, sender: self.sender.clone() }.send_impl(py, tag, fmt, values, true)
    }

    /// Leaves the tree; again: nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.close_impl(py, false).map(drop)
    }

    /// Awaitable `close`.
    fn close_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.close_impl(py, true)
    }

    /// Waits until everything this back-end sent is written out to its link,
    /// `timeout` seconds at most (None: no limit): a parent that stops reading never
    /// lets it end.
    #[pyo3(signature = (timeout=60.0))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.flush_impl(py, timeout, false).map(drop)
    }

    /// Awaitable `flush`.
    #[pyo3(signature = (timeout=60.0))]
    fn flush_async<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        self.flush_impl(py, timeout, true)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaves the tree cleanly, unless an exception is on its way out: then the
    /// back-end drops its link without a word, and the tree reports it lost with the
    /// end of its stderr (the traceback's last lines) once the process exits.
    fn __exit__(
        &self,
        py: Python<'_>,
        t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if t.is_some_and(|t| !t.is_none()) {
            self.closing.send_replace(true);
            let be = self.be.clone();
            wait(py, async move {
                drop(be.lock().await.take());
                Ok(())
            })?;
        } else {
            self.close(py)?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("BackEnd(rank={}, size={})", self.rank, self.size)
    }
}

/// The exception classes, made at import (see `errors`).
static EXCEPTIONS: PyOnceLock<errors::Classes> = PyOnceLock::new();

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let classes = errors::Classes::make(py)?;
    for (name, cls) in classes.named() {
        m.add(name, cls.bind(py))?;
    }
    let _ = EXCEPTIONS.set(py, classes);
    m.add_class::<PyRankSet>()?;
    m.add_class::<PyPacket>()?;
    m.add_class::<PyNetwork>()?;
    m.add_class::<PyStream>()?;
    m.add_class::<PyBackEnd>()?;
    m.add_class::<PyBackEndStream>()?;
    m.add_function(wrap_pyfunction!(hosts_list, m)?)?;
    m.add_function(wrap_pyfunction!(hosts_fold, m)?)?;
    m.add_function(wrap_pyfunction!(_resolve, m)?)?;
    m.add_function(wrap_pyfunction!(_at_exit, m)?)?;
    py.import("atexit")?.call_method1("register", (m.getattr("_at_exit")?,))?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Tags from here up are treecast's own (the generic back-end's requests, files).
    m.add("FIRST_RESERVED_TAG", treecast_api::FIRST_RESERVED_TAG)?;
    // Requests the generic back-end answers: for python/bench.py, which measures the
    // same protocol as `treecast bench microbench`.
    m.add("_TAG_ADD_RANK", treecast::apps::protocol::TAG_ADD_RANK)?;
    m.add("_TAG_BURST", treecast::apps::protocol::TAG_BURST)?;
    Ok(())
}
