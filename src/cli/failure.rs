//! A client command's failure and its exit code.

use std::process::ExitCode;

use ojs_client::ClientError;

/// A command's failure, as its exit code says.
#[derive(Debug)]
pub enum Failure {
    /// The server answered with an error (exit 1).
    Refused(String),
    /// Bad input the parser could not catch, such as arguments that are not JSON (exit 2).
    Usage(String),
    /// No usable answer (exit 3).
    Unreachable(String),
}

impl Failure {
    pub fn exit(self) -> ExitCode {
        let (code, message) = match self {
            Failure::Refused(m) => (1, m),
            Failure::Usage(m) => (2, m),
            Failure::Unreachable(m) => (3, m),
        };
        eprintln!("ojs-jetstream: {message}");
        ExitCode::from(code)
    }
}

impl From<ClientError> for Failure {
    fn from(err: ClientError) -> Failure {
        match err {
            ClientError::Server { .. } | ClientError::Refused(_) => {
                Failure::Refused(err.to_string())
            }
            ClientError::Transport(_)
            | ClientError::Unreadable(_)
            | ClientError::EventTooLarge(_) => Failure::Unreachable(err.to_string()),
        }
    }
}
