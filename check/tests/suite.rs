//! weir-check's tests, one module a file beside this one, built as one test binary (as
//! weir-core's are): `cargo test -p weir-check --test suite log_hash::` runs one file's.
#![cfg(not(target_arch = "wasm32"))]
// Test code: a failed unwrap or index is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod cli;
mod log_hash;
mod replay;
