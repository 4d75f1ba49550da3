//! Examples of assembling an Environment; see `src/bin/`.
