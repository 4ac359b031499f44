//! The one error table: every failure a client can see, with its HTTP status, its gRPC
//! status code and a bounded `kind` label. Messages say what failed and how to fix it; the
//! same failure reads the same over every protocol. Each lower layer's error maps into it
//! here, once; the API renders it (`api::error`).

use axum::http::StatusCode;

use crate::control::ControlError;
use crate::nn::models::RepositoryError;
use crate::nn::scheduler::{ComputeError, LOAD_RETRY};
use crate::oip::types::InvalidRequest;
use crate::rollout::app::VersionError;
use crate::runtime::GuestError;
use crate::tenancy::TenancyError;

/// Error kinds, each with one status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Unknown model, app or version (also foreign ones: no existence leak).
    NotFound,
    /// Malformed or inconsistent request.
    InvalidInput,
    /// Body larger than the tenant allows.
    PayloadTooLarge,
    /// The body did not arrive within the server's body timeout.
    BodyTimeout,
    /// The thing to create exists (an app version: versions are immutable).
    Conflict,
    /// Missing or wrong API key.
    Unauthenticated,
    /// The tenant is over one of its quotas.
    QuotaExceeded,
    /// The tenant's stored models, apps or versions are at one of its storage quotas.
    StorageQuota,
    /// The server (a model queue) is over capacity.
    Overloaded,
    /// The model is unloaded (by its tenant) or could not be loaded.
    Unavailable,
    /// The request ran past its deadline.
    DeadlineExceeded,
    /// The guest exhausted a resource limit (memory, stack).
    GuestResource,
    /// The guest trapped or reported an internal error.
    GuestFailure,
    /// A model call failed.
    ModelFailure,
    /// A host fault.
    Internal,
}

impl ErrorKind {
    pub fn status(self) -> StatusCode {
        match self {
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::InvalidInput => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::Conflict => StatusCode::CONFLICT,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            Self::StorageQuota => StatusCode::INSUFFICIENT_STORAGE,
            Self::Overloaded | Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Self::GuestResource | Self::GuestFailure | Self::ModelFailure | Self::Internal => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The gRPC status code for the same failure.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            Self::NotFound => tonic::Code::NotFound,
            Self::InvalidInput => tonic::Code::InvalidArgument,
            Self::Conflict => tonic::Code::AlreadyExists,
            Self::Unauthenticated => tonic::Code::Unauthenticated,
            Self::PayloadTooLarge | Self::QuotaExceeded | Self::StorageQuota | Self::GuestResource => {
                tonic::Code::ResourceExhausted
            }
            Self::Overloaded | Self::Unavailable => tonic::Code::Unavailable,
            Self::DeadlineExceeded | Self::BodyTimeout => tonic::Code::DeadlineExceeded,
            Self::GuestFailure | Self::ModelFailure | Self::Internal => tonic::Code::Internal,
        }
    }

    /// A bounded label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::InvalidInput => "invalid_input",
            Self::PayloadTooLarge => "payload_too_large",
            Self::BodyTimeout => "body_timeout",
            Self::Conflict => "conflict",
            Self::Unauthenticated => "unauthenticated",
            Self::QuotaExceeded => "quota_exceeded",
            Self::StorageQuota => "storage_quota",
            Self::Overloaded => "overloaded",
            Self::Unavailable => "unavailable",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::GuestResource => "guest_resource",
            Self::GuestFailure => "guest_failure",
            Self::ModelFailure => "model_failure",
            Self::Internal => "internal",
        }
    }
}

/// An error answered to a client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// When the client may try again (HTTP `Retry-After`), if known.
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), retry_after: None }
    }

    pub fn with_retry_after(mut self, wait: std::time::Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// An Open Inference Protocol request to an HTTP app, which answers HTTP only.
    pub fn http_app(name: &str) -> Self {
        Self::invalid(format!(
            "'{name}' is an HTTP app (a wasi:http/proxy component): send it HTTP requests at /v2/apps/{name}/http/"
        ))
    }

    /// An inference body over the tenant's `max_request_bytes` (`limit`), on either protocol.
    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            ErrorKind::PayloadTooLarge,
            format!("request body exceeds the tenant's limit of {limit} bytes (max_request_bytes)"),
        )
    }

    /// A model its tenant unloaded.
    pub fn unloaded(model: &str) -> Self {
        Self::new(
            ErrorKind::Unavailable,
            format!("model '{model}' is unloaded; load it with POST /v2/repository/models/{model}/load"),
        )
    }

    /// A body that did not arrive within the server's body timeout.
    pub fn body_timeout(timeout: std::time::Duration) -> Self {
        Self::new(
            ErrorKind::BodyTimeout,
            format!("the request body did not arrive within {} s (the server's body timeout)", timeout.as_secs_f64()),
        )
    }
}

impl From<ComputeError> for ApiError {
    fn from(error: ComputeError) -> Self {
        let kind = match &error {
            ComputeError::InvalidInput(_) => ErrorKind::InvalidInput,
            ComputeError::Overloaded { .. } | ComputeError::WaitTooLong { .. } => ErrorKind::Overloaded,
            ComputeError::OverShare { .. } | ComputeError::ResidentCap { .. } => ErrorKind::QuotaExceeded,
            ComputeError::DeadlineExceeded { .. } | ComputeError::TooLate { .. } => ErrorKind::DeadlineExceeded,
            ComputeError::Backend { .. } => ErrorKind::ModelFailure,
            ComputeError::Stopped { .. } => ErrorKind::Overloaded,
            ComputeError::LoadFailed { .. } => {
                return Self::new(ErrorKind::Unavailable, error.to_string()).with_retry_after(LOAD_RETRY);
            }
            ComputeError::NoRoom { .. } => ErrorKind::Unavailable,
            ComputeError::RunMemory { .. } if error.never_fits() => ErrorKind::GuestResource,
            ComputeError::RunMemory { .. } => ErrorKind::Overloaded,
            ComputeError::OutputTooLarge { .. } => ErrorKind::GuestResource,
            ComputeError::CircuitOpen { retry_ms, .. } => {
                let wait = std::time::Duration::from_millis(*retry_ms);
                return Self::new(ErrorKind::Overloaded, error.to_string()).with_retry_after(wait);
            }
        };
        Self::new(kind, error.to_string())
    }
}

impl From<RepositoryError> for ApiError {
    fn from(error: RepositoryError) -> Self {
        match error {
            RepositoryError::NotFound(_) => ApiError::not_found(error.to_string()),
            RepositoryError::LoadFailed { .. } => {
                ApiError::new(ErrorKind::Unavailable, error.to_string()).with_retry_after(LOAD_RETRY)
            }
            RepositoryError::NoRoom { .. } => ApiError::new(ErrorKind::Unavailable, error.to_string()),
            RepositoryError::ResidentCap { .. } => ApiError::new(ErrorKind::QuotaExceeded, error.to_string()),
        }
    }
}

impl From<TenancyError> for ApiError {
    fn from(error: TenancyError) -> Self {
        let kind = match &error {
            TenancyError::MissingKey | TenancyError::MalformedKey | TenancyError::UnknownKey => {
                ErrorKind::Unauthenticated
            }
            TenancyError::TooManyInFlight { .. } => ErrorKind::QuotaExceeded,
            TenancyError::WaitTooLong { .. } | TenancyError::LineFull { .. } if error.is_over_share() => {
                ErrorKind::QuotaExceeded
            }
            TenancyError::WaitTooLong { .. } | TenancyError::LineFull { .. } | TenancyError::TooLittleLeft { .. } => {
                ErrorKind::Overloaded
            }
            TenancyError::DeadlineWaiting => ErrorKind::DeadlineExceeded,
            TenancyError::TurnLost => ErrorKind::Internal,
        };
        Self::new(kind, error.to_string())
    }
}

impl From<ControlError> for ApiError {
    fn from(error: ControlError) -> Self {
        let kind = match &error {
            ControlError::NotFound(_) => ErrorKind::NotFound,
            ControlError::Invalid(_) => ErrorKind::InvalidInput,
            ControlError::Conflict(_) => ErrorKind::Conflict,
            ControlError::StorageQuota(_) => ErrorKind::StorageQuota,
            ControlError::Unavailable(_) => ErrorKind::Unavailable,
            ControlError::TooLarge(_) => ErrorKind::PayloadTooLarge,
            ControlError::Internal(_) => ErrorKind::Internal,
        };
        Self::new(kind, error.to_string())
    }
}

impl From<InvalidRequest> for ApiError {
    fn from(error: InvalidRequest) -> Self {
        Self::invalid(error.0)
    }
}

impl From<VersionError> for ApiError {
    fn from(error: VersionError) -> Self {
        match error {
            VersionError::Unknown(message) => Self::not_found(message),
            VersionError::Unprepared(message) => Self::new(ErrorKind::Unavailable, message),
        }
    }
}

impl From<GuestError> for ApiError {
    fn from(error: GuestError) -> Self {
        let kind = match &error {
            GuestError::Queue(queue) => return queue.clone().into(),
            GuestError::InvalidInput(_) => ErrorKind::InvalidInput,
            GuestError::Model(_) => ErrorKind::ModelFailure,
            GuestError::Internal(_) | GuestError::Trap(_) | GuestError::NoResponse | GuestError::Response(_) => {
                ErrorKind::GuestFailure
            }
            GuestError::Deadline { .. } => ErrorKind::DeadlineExceeded,
            GuestError::OutOfMemory { .. }
            | GuestError::StackOverflow
            | GuestError::TooManyResources { .. }
            | GuestError::ResponseTooLarge { .. } => ErrorKind::GuestResource,
            GuestError::NoInstanceSlot { .. } => ErrorKind::Overloaded,
        };
        Self::new(kind, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_refused_memory_is_the_callers_when_it_never_fits_and_a_retry_when_it_would() {
        let refused =
            |requested: u64| ApiError::from(ComputeError::RunMemory { model: "m".into(), requested, cap: 512 << 20 });
        let never = refused(1_600_000_000);
        assert_eq!(
            (never.kind.status(), never.kind.grpc_code()),
            (StatusCode::INTERNAL_SERVER_ERROR, tonic::Code::ResourceExhausted)
        );
        assert!(
            never.message.contains(
                "asked for 1526 MiB at once during its run, more than all model runs on this server may hold (512 MiB)"
            ),
            "{}",
            never.message
        );
        let later = refused(100 << 20);
        assert_eq!(
            (later.kind.status(), later.kind.grpc_code()),
            (StatusCode::SERVICE_UNAVAILABLE, tonic::Code::Unavailable)
        );
        assert!(
            later.message.contains("asked for 100 MiB") && later.message.ends_with("retry later"),
            "{}",
            later.message
        );
    }
}
