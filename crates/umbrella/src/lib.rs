//! cairn-umbrella: the UmbrellaFS policy layer (Garrison & Reddy, ACM TOS 2009).
//!
//! One namespace over several branch directories. Each file lives on exactly one branch,
//! chosen by ordered rules ([`rules`]); directories exist on every branch that holds
//! something under them and are created lazily. The layer implements
//! [`cairn_vfs::FileSystem`], so the same FUSE adapter as the core serves it.
//!
//! - [`config`]: the TOML configuration;
//! - [`rules`]: the pure policy decision module (first match, longest namespace match,
//!   overflow lists, branch-state conditions, hysteresis);
//! - `ns`: the location index and its persisted form;
//! - `fs`: the [`cairn_vfs::FileSystem`] implementation;
//! - `migrate`: moving files between branches; `record` and `recover`: the move record
//!   and the recovery of interrupted moves at mount;
//! - `exec`: host calls with deadlines (per-branch workers); `branch`: branch health;
//! - `disconnected`: a branch that comes back (re-reading it, sending files back);
//! - `enforce`, `admin`: the enforcer and the control commands.

mod admin;
mod branch;
pub mod config;
mod disconnected;
mod enforce;
mod exec;
mod failpoint;
mod fs;
mod migrate;
mod ns;
mod record;
mod recover;
mod rename;
pub mod rules;
mod scan;
mod sys;
mod xattr;

pub use admin::{hex, unhex};
pub use config::{Config, ConfigError, ErrorMode};
pub use failpoint::{Hook as FailpointHook, POINTS as FAILPOINTS};
pub use fs::Umbrella;
