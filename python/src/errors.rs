//! Failures of the binding's futures, and the Python exceptions they become.
//!
//! The futures run without the GIL, so a failure is kept as a [`Fail`] (a kind and
//! the Rust error's message, unchanged) until the thread that waits turns it into an
//! exception of the class its kind names.

use pyo3::exceptions::{PyException, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use treecast_api::ApiError;

/// Which exception a failure raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `treecast.Error`.
    Error,
    /// `treecast.FormatError`: a bad format string or values that do not match it.
    Format,
    /// `treecast.TimeoutError`: nothing came within the time limit.
    Timeout,
    /// `treecast.NetworkClosed`: the network, stream or back-end is closed or gone.
    Closed,
    /// `treecast.LaunchError`: the tree could not be started or joined.
    Launch,
    /// `treecast.FilterError`: a filter is unknown, refused, or refused a packet.
    Filter,
    /// `treecast.ArgumentError` (also a `ValueError`): an argument treecast refuses.
    Value,
}

/// A failure, kept without the GIL.
#[derive(Debug)]
pub(crate) struct Fail {
    kind: Kind,
    message: String,
}

impl Fail {
    /// A failure of `kind` saying `message`.
    pub(crate) fn new(kind: Kind, message: String) -> Fail {
        Fail { kind, message }
    }

    /// A failure of the CLI's code (anyhow): the kind of the API error inside it if
    /// there is one, else `kind`; the message with its whole chain, as the CLI prints it.
    pub(crate) fn from_anyhow(kind: Kind, e: anyhow::Error) -> Fail {
        let kind = e.downcast_ref::<ApiError>().map_or(kind, kind_of);
        Fail { kind, message: format!("{e:#}") }
    }

    /// The exception, with the GIL.
    pub(crate) fn into_pyerr(self, py: Python<'_>) -> PyErr {
        match crate::EXCEPTIONS.get(py) {
            Some(c) => match c.of(self.kind).bind(py).cast::<pyo3::types::PyType>() {
                Ok(t) => PyErr::from_type(t.clone(), self.message),
                Err(_) => PyException::new_err(self.message),
            },
            None => PyException::new_err(self.message),
        }
    }
}

/// The kind of an API error.
fn kind_of(e: &ApiError) -> Kind {
    match e {
        ApiError::Format(_) | ApiError::WrongFormat { .. } => Kind::Format,
        ApiError::Timeout(_) | ApiError::ClockTimeout { .. } => Kind::Timeout,
        ApiError::Closed(_) | ApiError::StreamClosed(_) | ApiError::UnknownStream(_) => Kind::Closed,
        ApiError::Startup(_)
        | ApiError::Launcher(_)
        | ApiError::Join(_)
        | ApiError::NoPlan { .. }
        | ApiError::NoBinary(_)
        | ApiError::NoBackends
        | ApiError::Topology(_)
        | ApiError::Attach(_)
        | ApiError::NotLaunched { .. }
        | ApiError::Env(_)
        | ApiError::Plugin(_) => Kind::Launch,
        ApiError::StreamFilter { .. }
        | ApiError::StreamRefused { .. }
        | ApiError::Filter { .. }
        | ApiError::FilterRefused { .. }
        | ApiError::FilterName { .. } => Kind::Filter,
        ApiError::RouteNotCarried { .. } => Kind::Value,
        _ => Kind::Error,
    }
}

impl From<ApiError> for Fail {
    fn from(e: ApiError) -> Fail {
        Fail { kind: kind_of(&e), message: e.to_string() }
    }
}

/// The exception classes of the package, made at import so that they can derive
/// from both `treecast.Error` and the built-in a caller may already catch.
pub(crate) struct Classes {
    error: Py<PyAny>,
    format: Py<PyAny>,
    timeout: Py<PyAny>,
    closed: Py<PyAny>,
    launch: Py<PyAny>,
    filter: Py<PyAny>,
    argument: Py<PyAny>,
}

/// `treecast.ArgumentError` saying `message`: an argument of a call that treecast
/// refuses, caught by `except treecast.Error` and by `except ValueError` alike.
pub(crate) fn argument_error(message: String) -> PyErr {
    Python::attach(|py| Fail::new(Kind::Value, message).into_pyerr(py))
}

impl Classes {
    /// Makes the classes.
    pub(crate) fn make(py: Python<'_>) -> PyResult<Classes> {
        let ty = py.import("builtins")?.getattr("type")?;
        let class = |name: &str, bases: Vec<Bound<'_, PyAny>>, doc: &str| -> PyResult<Py<PyAny>> {
            let ns = PyDict::new(py);
            ns.set_item("__module__", "treecast")?;
            ns.set_item("__doc__", doc)?;
            Ok(ty.call1((name, PyTuple::new(py, bases)?, ns))?.unbind())
        };
        let exc = py.get_type::<PyException>().into_any();
        let error =
            class("Error", vec![exc], "Every failure treecast reports; the message is the Rust library's.")?;
        let e = || error.bind(py).clone();
        Ok(Classes {
            format: class(
                "FormatError",
                vec![e(), py.get_type::<PyValueError>().into_any(), py.get_type::<PyTypeError>().into_any()],
                "A bad format string, or values that do not match it.",
            )?,
            timeout: class(
                "TimeoutError",
                vec![e(), py.get_type::<PyTimeoutError>().into_any()],
                "Nothing came within the time limit.",
            )?,
            closed: class("NetworkClosed", vec![e()], "The network, stream or back-end is closed or gone.")?,
            launch: class(
                "LaunchError",
                vec![e()],
                "The tree could not be started, or a back-end could not join it.",
            )?,
            filter: class(
                "FilterError",
                vec![e()],
                "A filter is unknown or was refused, or it refused a packet.",
            )?,
            argument: class(
                "ArgumentError",
                vec![e(), py.get_type::<PyValueError>().into_any()],
                "An argument treecast refuses: a route, a sync mode, a time limit, a rank set, a mode.",
            )?,
            error,
        })
    }

    /// The classes with their names, for the module.
    pub(crate) fn named(&self) -> [(&'static str, &Py<PyAny>); 7] {
        [
            ("Error", &self.error),
            ("FormatError", &self.format),
            ("TimeoutError", &self.timeout),
            ("NetworkClosed", &self.closed),
            ("LaunchError", &self.launch),
            ("FilterError", &self.filter),
            ("ArgumentError", &self.argument),
        ]
    }

    /// The class of `kind`.
    fn of(&self, kind: Kind) -> &Py<PyAny> {
        match kind {
            Kind::Format => &self.format,
            Kind::Timeout => &self.timeout,
            Kind::Closed => &self.closed,
            Kind::Launch => &self.launch,
            Kind::Filter => &self.filter,
            Kind::Value => &self.argument,
            Kind::Error => &self.error,
        }
    }
}
