//! Benchmark (not a test): `doctor logs` throughput on a generated nginx error log.
//!
//! `cargo run --release -p upkeep-doctor --example logs_bench [SIZE_MB] [--gzip]` (default
//! 1024 MB) writes a log of about SIZE_MB into a temporary directory (gzip-compressed with
//! `--gzip`), runs the same analysis as `upkeep doctor logs` over it, prints MB/s of log text
//! and the peak resident memory, and removes it.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

/// A day of traffic: mostly noise, an NXDOMAIN outage and a max_fails episode every so often.
fn generate(path: &Path, target_bytes: u64) -> std::io::Result<u64> {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let (mut written, mut t, mut n) = (0u64, 0i64, 0u64);
    let mut lines = Vec::new();
    while written < target_bytes {
        let (h, m, s) = ((t / 3600) % 24, (t / 60) % 60, t % 60);
        for i in 0..40u64 {
            n += 1;
            lines.push(format!("[warn] 2101#2101: *{n} an upstream response is buffered to a temporary file /var/cache/nginx/proxy_temp/3/{i:02}/00000{n} while reading upstream, client: 10.1.{i}.{}, server: shop.example, request: \"GET /api/v1/items?page={i} HTTP/1.1\", upstream: \"http://10.0.0.{}:8080/api/v1/items?page={i}\", host: \"shop.example\"", n % 250, i % 8));
            lines.push(format!("[info] 2101#2101: *{n} client prematurely closed connection while sending response to client, client: 10.1.{i}.{}, server: shop.example, request: \"GET /static/app.{n}.js HTTP/1.1\", host: \"shop.example\"", n % 250));
        }
        let no_live = format!("[error] 2101#2101: *{n} no live upstreams while connecting to upstream, client: 10.1.2.3, server: shop.example, request: \"GET /api HTTP/1.1\", upstream: \"http://be/api\", host: \"shop.example\"");
        match t % 600 {
            0 => lines.push("[error] 2101#2101: app.example.com could not be resolved (3: Host not found)".to_owned()),
            300 => lines.push(format!("[error] 2101#2101: *{n} connect() failed (111: Connection refused) while connecting to upstream, client: 10.1.2.3, server: shop.example, request: \"GET /api HTTP/1.1\", upstream: \"http://10.0.0.1:8080/api\", host: \"shop.example\"")),
            _ => {}
        }
        if matches!(t % 600, 0..=5 | 300..=309) {
            lines.extend(std::iter::repeat_n(no_live, 50));
        }
        for l in lines.drain(..) {
            let l = format!("2026/11/30 {h:02}:{m:02}:{s:02} {l}\n");
            written += l.len() as u64;
            w.write_all(l.as_bytes())?;
        }
        t += 1;
    }
    w.flush()?;
    Ok(written)
}

/// Peak resident set size of this process, from /proc (Linux), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gzip = args.iter().any(|a| a == "--gzip");
    let mb: u64 = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1024);
    let dir = std::env::temp_dir().join(format!("upkeep-logs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> anyhow::Result<()> {
        let t0 = Instant::now();
        let plain = dir.join("error.log");
        let bytes = generate(&plain, mb << 20)?;
        println!(
            "generated {:.1} MB in {:.1} s",
            bytes as f64 / 1e6,
            t0.elapsed().as_secs_f64()
        );
        let path = if gzip { compress(&plain)? } else { plain };
        let rss_before = peak_rss_kib();
        let t1 = Instant::now();
        let findings = upkeep_doctor::logs::analyze(&[path.as_path()], &[])?;
        let secs = t1.elapsed().as_secs_f64();
        println!(
            "analyzed {:.1} MB of log text in {:.2} s: {:.0} MB/s, {} episodes",
            bytes as f64 / 1e6,
            secs,
            bytes as f64 / 1e6 / secs,
            findings.len()
        );
        if let (Some(before), Some(after)) = (rss_before, peak_rss_kib()) {
            println!("peak RSS: {before} KiB before the analysis, {after} KiB after");
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Replaces `plain` with `plain.gz` (fast compression) and returns the new path.
fn compress(plain: &Path) -> anyhow::Result<std::path::PathBuf> {
    let gz = plain.with_extension("log.gz");
    let mut enc = flate2::write::GzEncoder::new(
        BufWriter::new(std::fs::File::create(&gz)?),
        flate2::Compression::fast(),
    );
    std::io::copy(&mut std::fs::File::open(plain)?, &mut enc)?;
    enc.finish()?.flush()?;
    std::fs::remove_file(plain)?;
    println!(
        "compressed to {:.1} MB",
        std::fs::metadata(&gz)?.len() as f64 / 1e6
    );
    Ok(gz)
}
