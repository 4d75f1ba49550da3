//! The methods of the control socket: the workspace service's use cases under their own names
//! ([`Method`]), and the published schema of their parameters, results and errors.

pub use environment_workspace::Method;

/// The published schema of the control socket (OpenRPC-style JSON).
pub const SCHEMA: &str = include_str!("../schema/control.json");
