//! environment-policy (in progress).
