//! The error a handler returns; the host maps its kind to an OIP status (invalid input is
//! a client error, the others are server errors).

use crate::bindings::sluice::tenant::types::InferError;
use std::fmt;

/// Why a handler could not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The request is unacceptable (answered as HTTP 400 / gRPC INVALID_ARGUMENT).
    InvalidInput(String),
    /// A model call failed.
    Model(String),
    /// The component failed for another reason.
    Internal(String),
}

impl Error {
    /// An invalid-input error with a message for the client.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::InvalidInput(message.into())
    }

    /// A model error.
    pub fn model(message: impl Into<String>) -> Self {
        Self::Model(message.into())
    }

    /// An internal error.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal(message.into())
    }

    pub(crate) fn into_wire(self) -> InferError {
        match self {
            Self::InvalidInput(m) => InferError::InvalidInput(m),
            Self::Model(m) => InferError::ModelError(m),
            Self::Internal(m) => InferError::Internal(m),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidInput(m) => write!(f, "invalid input: {m}"),
            Self::Model(m) => write!(f, "model error: {m}"),
            Self::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for Error {}
