//! The upkeep proxy: listeners, routes, upstream groups, pool, health, probes.
#![forbid(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod body;
pub mod boundary;
pub mod cli;
pub mod config;
pub mod error;
pub mod expect;
pub mod fxhash;
pub mod grpc;
pub mod h1;
mod h2server;
pub mod headers;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod normalize;
pub mod pool;
pub mod proxy;
pub mod refused;
pub mod request_id;
pub mod rescue;
pub mod route;
pub mod rules;
pub mod server;
mod spare;
pub mod state;
pub mod trailers;
pub mod upgrade;
pub mod upstream;
