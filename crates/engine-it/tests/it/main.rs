//! The engine's integration tests: one binary, a module per feature.

mod builds;
mod changes;
mod common;
mod cost;
mod failures;
mod limits;
mod model;
mod refusals;
mod scenarios;
mod search;
mod transfer;
