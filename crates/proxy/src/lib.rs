//! The upkeep proxy: listeners, routes, upstream groups, pool, health, probes.
#![forbid(unsafe_code)]

pub mod cli {
    //! `upkeep serve`, `check`, `reload`.
    use std::process::ExitCode;

    /// Arguments of `upkeep serve`.
    #[derive(Debug, clap::Args)]
    pub struct ServeArgs {}
    /// Arguments of `upkeep check`.
    #[derive(Debug, clap::Args)]
    pub struct CheckArgs {}
    /// Arguments of `upkeep reload`.
    #[derive(Debug, clap::Args)]
    pub struct ReloadArgs {}

    /// Runs the proxy.
    pub fn serve(_args: ServeArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("not built yet")
    }
    /// Validates a config file.
    pub fn check(_args: CheckArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("not built yet")
    }
    /// Asks a running upkeep to reload.
    pub fn reload(_args: ReloadArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("not built yet")
    }
}
