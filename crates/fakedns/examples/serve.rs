//! Serves a zone file on UDP and TCP and prints every query, one line each:
//! `cargo run -p upkeep-fakedns --example serve -- 127.0.0.1:5353 zone.toml`

use std::time::UNIX_EPOCH;

use upkeep_fakedns::{FakeDns, Zone};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(path)) = (args.next(), args.next()) else {
        return Err("usage: serve LISTEN_ADDR ZONE_FILE".into());
    };
    let text = std::fs::read_to_string(&path)?;
    let zone = Zone::from_toml_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let dns = FakeDns::start(listen.parse()?, zone).await?;
    println!("serving {} (udp+tcp)", dns.local_addr());
    let mut queries = dns.subscribe();
    loop {
        tokio::select! {
            q = queries.recv() => match q {
                Ok(q) => {
                    let at = q.at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
                    println!("{at:.3}\t{}\t{}\t{}\t{}\t{}", q.transport.as_str(), q.client, q.name, q.qtype, q.answer);
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    println!("# {n} queries not printed (output too slow)");
                }
                Err(_) => break,
            },
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    dns.shutdown().await;
    Ok(())
}
