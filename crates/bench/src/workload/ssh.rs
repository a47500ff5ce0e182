//! STUB — being written (see the module list in workload/mod.rs).

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::{PhaseResult, Stage};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub scale: f64,
}

impl Config {
    pub fn paper() -> Config {
        Config::scaled(1.0)
    }
    pub fn scaled(scale: f64) -> Config {
        Config { scale }
    }
    pub fn describe(&self) -> String {
        "not implemented yet".into()
    }
}

pub fn run(_stage: &mut dyn Stage, _cfg: &Config) -> Result<Vec<PhaseResult>> {
    bail!("ssh: not implemented yet")
}
