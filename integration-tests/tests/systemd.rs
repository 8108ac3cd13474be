//! `Type=notify` as systemd runs it (deploy/systemd/herald@.service): Herald, given a
//! `NOTIFY_SOCKET`, says READY=1 once started and STOPPING=1 when SIGTERM makes it drain.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use anyhow::{Context, Result};
use integration_tests::{wait_for, TestEnv};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_tells_the_service_manager_when_it_is_up_and_when_it_drains() -> Result<()> {
    let env = TestEnv::new("systemd", "").await?;
    let socket_path = env.dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path)?;
    socket.set_nonblocking(true)?;
    let socket_text = socket_path.to_str().context("utf-8 path")?.to_owned();
    let mut herald = env.spawn_roles(
        "ingest,relay",
        "herald",
        &[("NOTIFY_SOCKET", socket_text.as_str())],
    )?;
    let mut said = Vec::new();
    let read = |said: &mut Vec<String>| {
        let mut buf = [0u8; 512];
        while let Ok(n) = socket.recv(&mut buf) {
            said.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        said.join("\n")
    };
    wait_for("READY=1", WAIT, || {
        let text = read(&mut said);
        async move { Ok(text.contains("READY=1").then_some(())) }
    })
    .await?;
    wait_for("STATUS=ready", WAIT, || {
        let text = read(&mut said);
        async move { Ok(text.contains("STATUS=ready").then_some(())) }
    })
    .await?;
    let status = herald.terminate(Duration::from_secs(30)).await?;
    assert!(status.success(), "{status:?}");
    let text = read(&mut said);
    assert!(text.contains("STOPPING=1"), "{text}");
    env.cleanup().await;
    Ok(())
}
