//! The SQL Server lab: the workload simulator as child processes (sim.rs),
//! ext4 on loop devices for its files and a cgroup that slows a device down
//! (storage.rs).

mod sim;
mod storage;

pub use sim::{ClientReport, Placement, SMALL_FILES, SqlClientRun, SqlServerSim};
pub use storage::{Cgroup, Mounted, SlowDisk};
