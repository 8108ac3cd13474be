//! SIGTERM / SIGINT: a watch channel every role selects on, so each stops taking work,
//! finishes or abandons its current batch safely, commits, and returns.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Installs the signal handlers and returns the receiver side.
    pub fn install() -> std::io::Result<Self> {
        let (tx, rx) = watch::channel(false);
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received: draining"),
                _ = int.recv() => tracing::info!("SIGINT received: draining"),
            }
            let _ = tx.send(true);
        });
        Ok(Self(rx))
    }

    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once shutdown is requested.
    pub async fn requested(&mut self) {
        let _ = self.0.wait_for(|v| *v).await;
    }
}
