//! environment-bus (in progress).
