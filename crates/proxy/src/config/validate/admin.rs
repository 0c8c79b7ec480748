//! The `[admin]` table: control and probe listeners, the reload token, admin limits.

use super::super::model::{AdminConfig, DEFAULT_ADMIN_HEADER_READ_TIMEOUT};
use super::super::surface;
use super::Ctx;

/// Validates `[admin]`; every problem is recorded in `cx`.
pub(super) fn admin(cx: &mut Ctx<'_>, a: Option<&surface::Admin>) -> AdminConfig {
    let mut m = AdminConfig::default();
    let Some(a) = a else { return m };
    if let Some(l) = &a.listen {
        m.listen = cx.socket_addr(l, "admin listen").unwrap_or(m.listen);
    }
    if let Some(p) = &a.probes {
        m.probes = cx.socket_addr(p, "admin probes");
        if let Some(addr) = m.probes {
            if addr.port() != 0 && addr == m.listen {
                cx.err(
                    p.span(),
                    format!("admin probes {addr} is the same address as admin listen"),
                );
            }
        }
    }
    if let Some(t) = &a.token_file {
        let path = cx.loc.base_dir().join(t.get_ref());
        // Read now, like `nginx -t` opens certificates: a token that cannot be read would
        // otherwise show up only as every reload being refused.
        match std::fs::read_to_string(&path) {
            Ok(s) if s.trim().is_empty() => cx.err(
                t.span(),
                format!("admin token_file {} is empty", path.display()),
            ),
            Ok(_) => {}
            Err(e) => cx.err(
                t.span(),
                format!("admin token_file {} cannot be read: {e}", path.display()),
            ),
        }
        m.token_file = Some(path);
    }
    m.header_read_timeout = cx.duration(&a.header_read_timeout, DEFAULT_ADMIN_HEADER_READ_TIMEOUT);
    if m.header_read_timeout.is_zero() {
        if let Some(v) = &a.header_read_timeout {
            cx.err(v.span(), "admin header_read_timeout must be above zero");
        }
        m.header_read_timeout = DEFAULT_ADMIN_HEADER_READ_TIMEOUT;
    }
    m.max_connections = cx.int(
        &a.max_connections,
        m.max_connections as u64,
        1,
        4096,
        "admin max_connections",
    ) as usize;
    if let Err(e) = m.check_exposure() {
        let span = a.listen.as_ref().map_or(0..0, |l| l.span());
        cx.err(span, e);
    }
    m
}
