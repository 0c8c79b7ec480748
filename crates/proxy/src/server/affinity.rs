//! Which CPU each serving thread runs on (`upkeep serve --cpu-affinity`).
//!
//! Left to the scheduler, the serving threads of a busy machine are often woken onto the CPU
//! of whoever woke them (the client, the backend) and share one CPU for a while, together with
//! those; every connection of both threads then waits, which is where the multi-millisecond
//! tails of docs/benchmarks.md ("Tails: serving threads on their own CPUs") came from. A
//! serving thread per CPU, each held to its own, cannot be stacked that way.
//!
//! `auto` pins only when that layout is what the process was given: as many serving threads as
//! CPUs it may run on (a cpuset, `taskset`, a machine of that size). With more CPUs than
//! threads (a CPU quota on a large host, `--workers` below the CPU count) it does not guess
//! which CPUs are free, and says so.

use std::fmt;
use std::str::FromStr;

/// `--cpu-affinity`: where the serving threads may run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CpuAffinity {
    /// One thread per allowed CPU, in order, when the counts match; otherwise none pinned.
    #[default]
    Auto,
    /// Every thread may run on every allowed CPU.
    Off,
    /// Thread `i` on the `i`-th CPU of the list (one per thread).
    List(Vec<usize>),
}

impl FromStr for CpuAffinity {
    type Err = String;

    /// `auto`, `off`, or CPU numbers and ranges: `0,2,4-7`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => return Ok(Self::Auto),
            "off" => return Ok(Self::Off),
            _ => {}
        }
        let mut cpus = Vec::new();
        for part in s.split(',') {
            let bad = || {
                format!("`{part}` is not a CPU number or range (`auto`, `off`, or like `0,2,4-7`)")
            };
            let num = |n: &str| n.trim().parse::<usize>().map_err(|_| bad());
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(bad());
                    }
                    cpus.extend(a..=b);
                }
                None => cpus.push(num(part)?),
            }
        }
        Ok(Self::List(cpus))
    }
}

impl fmt::Display for CpuAffinity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Off => f.write_str("off"),
            Self::List(cpus) => f.write_str(&cpu_list(cpus)),
        }
    }
}

/// The CPU of each serving thread (`None`: not pinned), and one line saying what was chosen
/// and why, for the start-up log.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub cpus: Vec<Option<usize>>,
    pub why: String,
}

/// Plans `workers` serving threads on the CPUs this process may run on.
pub fn plan(affinity: &CpuAffinity, workers: usize) -> Result<Plan, String> {
    if *affinity == CpuAffinity::Off {
        return plan_with(&[], affinity, workers);
    }
    let allowed =
        allowed_cpus().map_err(|e| format!("reading the CPUs this process may run on: {e}"))?;
    plan_with(&allowed, affinity, workers)
}

/// `plan` on a given set of allowed CPUs (ascending).
pub fn plan_with(
    allowed: &[usize],
    affinity: &CpuAffinity,
    workers: usize,
) -> Result<Plan, String> {
    let unpinned = |why: String| Plan {
        cpus: vec![None; workers],
        why,
    };
    Ok(match affinity {
        CpuAffinity::Off => unpinned("serving threads not pinned to CPUs (--cpu-affinity off)".into()),
        CpuAffinity::Auto if allowed.len() == workers => Plan {
            cpus: allowed.iter().copied().map(Some).collect(),
            why: format!(
                "serving threads pinned one per CPU, to CPUs {} (--cpu-affinity auto: as many threads as allowed CPUs)",
                cpu_list(allowed)
            ),
        },
        CpuAffinity::Auto => unpinned(format!(
            "serving threads not pinned to CPUs: {}, {} ({}); --cpu-affinity auto pins only when the counts match, --cpu-affinity LIST pins anyway",
            count(workers, "thread"),
            count(allowed.len(), "allowed CPU"),
            cpu_list(allowed)
        )),
        CpuAffinity::List(cpus) => {
            if cpus.len() != workers {
                return Err(format!(
                    "--cpu-affinity {} names {} for {workers} serving threads (--workers): name one per thread",
                    cpu_list(cpus),
                    count(cpus.len(), "CPU")
                ));
            }
            if let Some(c) = cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(format!(
                    "--cpu-affinity names CPU {c}, which this process may not run on (allowed: {})",
                    cpu_list(allowed)
                ));
            }
            Plan {
                cpus: cpus.iter().copied().map(Some).collect(),
                why: format!(
                    "serving threads pinned to CPUs {} (--cpu-affinity)",
                    cpu_list(cpus)
                ),
            }
        }
    })
}

/// The CPUs the calling thread may run on, ascending.
pub fn allowed_cpus() -> nix::Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
    Ok((0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Holds the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

/// `1 CPU`, `2 CPUs`.
fn count(n: usize, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

/// `0-3,6` style (runs of three or more as ranges).
fn cpu_list(cpus: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        match j - i {
            0 => out.push(cpus[i].to_string()),
            1 => out.extend([cpus[i].to_string(), cpus[j].to_string()]),
            _ => out.push(format!("{}-{}", cpus[i], cpus[j])),
        }
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_auto_off_and_lists_with_ranges() {
        assert_eq!("auto".parse(), Ok(CpuAffinity::Auto));
        assert_eq!("off".parse(), Ok(CpuAffinity::Off));
        assert_eq!(
            "0,2,4-6".parse(),
            Ok(CpuAffinity::List(vec![0, 2, 4, 5, 6]))
        );
        for bad in ["", "x", "1,", "3-1", "-1", "on"] {
            let e = bad.parse::<CpuAffinity>().unwrap_err();
            assert!(e.contains("is not a CPU number or range"), "{bad}: {e}");
        }
        assert_eq!(
            CpuAffinity::List(vec![0, 1, 2, 5, 7, 8]).to_string(),
            "0-2,5,7,8"
        );
    }

    #[test]
    fn auto_pins_one_thread_per_allowed_cpu_only_when_the_counts_match() {
        let p = plan_with(&[2, 3], &CpuAffinity::Auto, 2).unwrap();
        assert_eq!(p.cpus, vec![Some(2), Some(3)]);
        assert!(
            p.why.contains("pinned one per CPU, to CPUs 2,3"),
            "{}",
            p.why
        );

        let p = plan_with(&[0, 1, 2, 3], &CpuAffinity::Auto, 2).unwrap();
        assert_eq!(p.cpus, vec![None, None]);
        assert!(
            p.why.contains("2 threads, 4 allowed CPUs (0-3)"),
            "{}",
            p.why
        );

        let p = plan_with(&[0, 1], &CpuAffinity::Off, 2).unwrap();
        assert_eq!(p.cpus, vec![None, None]);
    }

    #[test]
    fn a_list_names_one_allowed_cpu_per_thread() {
        let p = plan_with(&[0, 1, 2, 3], &CpuAffinity::List(vec![3, 1]), 2).unwrap();
        assert_eq!(p.cpus, vec![Some(3), Some(1)]);

        let e = plan_with(&[0, 1], &CpuAffinity::List(vec![0]), 2).unwrap_err();
        assert!(e.contains("names 1 CPU for 2 serving threads"), "{e}");
        let e = plan_with(&[0, 1], &CpuAffinity::List(vec![0, 5]), 2).unwrap_err();
        assert!(
            e.contains("CPU 5, which this process may not run on (allowed: 0,1)"),
            "{e}"
        );
    }
}
