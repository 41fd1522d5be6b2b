//! The HTTP API in-process (`oneshot`): every endpoint, every error, the
//! access-control table, and the OpenAPI document against the router.

mod access;
mod connections;
mod endpoints;
mod live;
mod openapi;
mod support;
mod web;
