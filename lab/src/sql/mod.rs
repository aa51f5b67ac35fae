//! The SQL Server lab: the workload simulator's server as child processes
//! (sim.rs), its clients and real drivers' (clients.rs), ext4 on loop devices
//! for its files and a cgroup that slows a device down (storage.rs).

mod clients;
mod sim;
mod storage;

pub use clients::{
    ClientReport, FreeTds, LOGGED_IN_SEGS, MSSQL_PYTHON, Odbc, SqlClientRun, segments_in,
};
pub use sim::{Placement, SMALL_FILES, SqlServerSim};
pub use storage::{Cgroup, Mounted, SlowDisk};
