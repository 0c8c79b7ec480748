//! The fault lab: fake DNS, fault backends, open-loop load, scenarios and reports.
#![forbid(unsafe_code)]

pub mod cli {
    //! `upkeep lab ...` and `upkeep demo`.
    use std::process::ExitCode;

    /// Arguments of `upkeep lab`.
    #[derive(Debug, clap::Args)]
    pub struct LabArgs {}

    /// Arguments of `upkeep demo`.
    #[derive(Debug, clap::Args)]
    pub struct DemoArgs {}

    /// Runs `upkeep lab ...`.
    pub fn run(_args: LabArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("the lab is not built yet")
    }

    /// Runs `upkeep demo`.
    pub fn run_demo(_args: DemoArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("the demo is not built yet")
    }
}
