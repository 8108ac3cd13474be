//! systemd's readiness protocol (`Type=notify`, sd_notify(3)) without libsystemd: one
//! datagram per state change to the socket in `$NOTIFY_SOCKET` (a path, or `@name` in the
//! abstract namespace). Outside systemd the variable is unset and every call does nothing.
//!
//! Herald says `READY=1` once start-up is over (migrations, listeners bound, roles
//! started), `STATUS=` when readiness changes, and `STOPPING=1` when it starts draining.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=value` lines) to the service manager, if any. A
/// failure is logged, never fatal: the manager's timeouts are the fallback.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&path, state) {
        tracing::warn!(error = %e, socket = ?path, "sd_notify failed");
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<usize> {
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    match path.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(state.as_bytes(), &addr)
        }
        None => socket.send_to(state.as_bytes(), path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_a_path_socket_and_an_abstract_one() {
        let dir = std::env::temp_dir().join(format!("herald-sd-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("herald-sd-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_listener = UnixDatagram::bind_addr(&addr).unwrap();
        send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = abstract_listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
