//! The doctor: finds the seeds' traps in nginx configs, error logs, Kubernetes manifests and live servers.
#![forbid(unsafe_code)]

pub mod cli {
    //! `upkeep doctor ...`.
    use std::process::ExitCode;

    /// Arguments of `upkeep doctor`.
    #[derive(Debug, clap::Args)]
    pub struct DoctorArgs {}

    /// Runs `upkeep doctor ...`; exit 0 clean, 1 findings, 2 unreadable input.
    pub fn run(_args: DoctorArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("the doctor is not built yet")
    }
}
