//! The real `tarn` binary over TCP: start, serve, stop gracefully with a
//! request in flight, restart on the same data, refuse a second process.

mod bench;
mod http;
mod nodes;
mod process;
