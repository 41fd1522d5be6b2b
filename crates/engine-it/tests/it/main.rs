//! The engine's integration tests: one binary, a module per feature.

mod builds;
mod common;
mod cost;
mod model;
mod refusals;
mod scenarios;
