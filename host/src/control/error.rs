//! What the control plane refuses or fails at; mapped once into the API's error table.

/// Why a change to a tenant's serving state was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// No such tenant, app, version or key (the caller's own namespace only).
    #[error("{0}")]
    NotFound(String),
    /// The change itself is invalid: bad quotas, bad traffic, an unusable upload.
    #[error("{0}")]
    Invalid(String),
    /// What the change would create exists (versions and model names are immutable).
    #[error("{0}")]
    Conflict(String),
    /// The server cannot take it now (the model memory budget is full).
    #[error("{0}")]
    Unavailable(String),
    /// The upload can never be served here (a model larger than the whole memory budget).
    #[error("{0}")]
    TooLarge(String),
    /// The tenant is at one of its storage quotas.
    #[error("{0}")]
    StorageQuota(String),
    /// A host fault (the store could not be written, no randomness for a key).
    #[error("{0}")]
    Internal(String),
}
