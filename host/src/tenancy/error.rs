//! What tenancy refuses: unknown callers, requests over a tenant's quota, and requests the
//! server has no turn for in time. Mapped once into the API's error table.

use std::time::Duration;

/// Why a caller or a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenancyError {
    #[error("missing API key: send 'Authorization: Bearer <tenant key>'")]
    MissingKey,
    #[error("malformed Authorization header: expected 'Bearer <tenant key>'")]
    MalformedKey,
    #[error("invalid API key")]
    UnknownKey,
    #[error("tenant '{tenant}' already has {max} requests in flight (max_concurrent_requests); retry later")]
    TooManyInFlight { tenant: String, max: u32 },
    /// The line ahead of a new request and its own work would outlast its deadline. `tenant` is set when it
    /// holds more than its share of the server (its own quota's fault, not the server's).
    #[error("{}", wait_too_long(tenant.as_deref(), *predicted, *budget))]
    WaitTooLong { tenant: Option<String>, predicted: Duration, budget: Duration },
    /// Every place in line is taken (`tenant` as above).
    #[error("{}", line_full(tenant.as_deref()))]
    LineFull { tenant: Option<String> },
    #[error("the request's deadline passed while it waited for the server to start it")]
    DeadlineWaiting,
    /// Its turn came with less of its deadline left than requests take now: refused rather
    /// than started only to run out of time.
    #[error(
        "the server is at capacity: the request's turn came with {} ms of its deadline left, and requests take \
         about {} ms now; retry later",
        left.as_millis(),
        needed.as_millis()
    )]
    TooLittleLeft { left: Duration, needed: Duration },
    #[error("the request's turn was lost")]
    TurnLost,
}

impl TenancyError {
    /// Whether the tenant's own use caused it (a quota), rather than the server being full.
    pub fn is_over_share(&self) -> bool {
        match self {
            Self::TooManyInFlight { .. } => true,
            Self::WaitTooLong { tenant, .. } | Self::LineFull { tenant } => tenant.is_some(),
            _ => false,
        }
    }
}

fn wait_too_long(over_share: Option<&str>, predicted: Duration, budget: Duration) -> String {
    let wait = format!(
        "a new request would take about {} ms to start and finish at this load, more than half of its remaining {} ms",
        predicted.as_millis(),
        budget.as_millis()
    );
    match over_share {
        Some(tenant) => format!(
            "the server is at capacity and tenant '{tenant}' holds more than its share of it: {wait}; retry later"
        ),
        None => format!("the server is at capacity: {wait}; retry later"),
    }
}

fn line_full(over_share: Option<&str>) -> String {
    match over_share {
        Some(tenant) => format!(
            "the server is at capacity and tenant '{tenant}' already has its share of the requests waiting to \
             start; retry later"
        ),
        None => "the server is at capacity: too many requests waiting to start; retry later".to_string(),
    }
}
