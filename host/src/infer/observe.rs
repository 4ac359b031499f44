//! Observing a request: what it was routed to (its metric labels and the objectives it
//! counts towards), in flight while it is served, then counted by status with its duration,
//! or as cancelled when its caller goes away first.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::error::ApiError;
use crate::telemetry::activity::Activity;
use crate::telemetry::metrics::{Protocol, RequestLabels, metrics};
use crate::telemetry::slo::AppSlo;

/// The app (or plain model) and version a request went to, once known: its metric labels,
/// and the app's objectives it counts towards. Names the tenant does not have stay empty, so
/// clients cannot mint label values.
#[derive(Debug, Default)]
pub struct Routed(Mutex<RoutedTo>);

#[derive(Debug, Default)]
struct RoutedTo {
    app: String,
    version: String,
    slo: Option<Arc<AppSlo>>,
    activity: Option<Arc<Activity>>,
}

impl Routed {
    /// `activity`: where the tenant's status page counts the app's or model's requests.
    pub(super) fn set(&self, app: &str, version: &str, slo: Option<&Arc<AppSlo>>, activity: Option<Arc<Activity>>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) =
            RoutedTo { app: app.to_string(), version: version.to_string(), slo: slo.cloned(), activity };
    }

    /// The version traffic routing chose, for a request already [`Routed::set`] to its app.
    pub(super) fn set_version(&self, version: &str) {
        let mut routed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        routed.version.clear();
        routed.version.push_str(version);
    }

    fn take(&self) -> RoutedTo {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// What the protocol layer passes along with a request besides its body: its headers (for
/// the sticky traffic key) and where to note what it was routed to.
#[derive(Clone, Copy)]
pub struct Caller<'a> {
    pub header: &'a (dyn Fn(&str) -> Option<String> + Sync),
    pub routed: &'a Routed,
}

/// Serve one inference request of `tenant` and record it: in flight while `serve` runs,
/// then counted by status class with its duration (and its error kind when it failed). A
/// request whose caller goes away first is dropped unfinished: it is counted as cancelled.
pub async fn observed<T>(
    tenant: &str,
    protocol: Protocol,
    routed: &Routed,
    serve: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    observed_with(tenant, protocol, routed, |_| 200, serve).await
}

/// [`observed`] for answers that carry their own status (an HTTP app's response).
pub async fn observed_with<T>(
    tenant: &str,
    protocol: Protocol,
    routed: &Routed,
    status_of: impl FnOnce(&T) -> u16,
    serve: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let mut cancelled = Cancelled { tenant, protocol, routed, started: std::time::Instant::now(), armed: true };
    // Declared after `cancelled`, so dropped before it: a scrape that sees a request counted
    // as cancelled no longer sees it in flight.
    let _in_flight = metrics().inflight(tenant);
    let result = serve.await;
    cancelled.armed = false;
    let elapsed = cancelled.started.elapsed();
    let RoutedTo { app, version, slo, activity } = routed.take();
    let (status, failure) = match &result {
        Ok(answer) => (status_of(answer), None),
        Err(err) => (err.kind.status().as_u16(), Some(err.kind.label())),
    };
    if let Some(slo) = slo {
        slo.record(status, elapsed);
    }
    if let Some(activity) = activity {
        activity.record(status, elapsed);
    }
    let labels = RequestLabels { tenant, app: &app, version: &version, protocol };
    metrics().request(labels, status, failure, elapsed);
    result
}

/// Counts a request whose future is dropped before it answers (the client disconnected or
/// cancelled): status 499 as nginx logs it, failure `cancelled`. Not counted against SLOs:
/// the client chose not to wait.
struct Cancelled<'a> {
    tenant: &'a str,
    protocol: Protocol,
    routed: &'a Routed,
    started: std::time::Instant,
    armed: bool,
}

impl Drop for Cancelled<'_> {
    fn drop(&mut self) {
        if self.armed {
            let RoutedTo { app, version, .. } = self.routed.take();
            let labels = RequestLabels { tenant: self.tenant, app: &app, version: &version, protocol: self.protocol };
            metrics().request(labels, CLIENT_CLOSED_REQUEST, Some(CANCELLED), self.started.elapsed());
        }
    }
}

/// The status of a request whose client went away (nginx's 499), and its failure label.
const CLIENT_CLOSED_REQUEST: u16 = 499;
const CANCELLED: &str = "cancelled";

/// Count a request refused before it was served (as [`observed`] counts served ones).
pub fn count_refused(tenant: &str, protocol: Protocol, error: &ApiError) {
    let labels = RequestLabels { tenant, app: "", version: "", protocol };
    metrics().request(labels, error.kind.status().as_u16(), Some(error.kind.label()), Duration::ZERO);
}
