//! Network faults between herald and moto, through the local stack's toxiproxy
//! (`deploy/local/toxiproxy.sh`, API on 127.0.0.1:18474). Each test makes its own proxy on
//! its own port and deletes it at the end.

use anyhow::{ensure, Result};
use serde_json::json;

use crate::http::request;

pub const API: &str = "127.0.0.1:18474";

pub struct Proxy {
    pub name: String,
    pub listen: String,
}

impl Proxy {
    /// A proxy on a free loopback port in front of `upstream`.
    pub async fn create(name: &str, upstream: &str) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let listen = format!("127.0.0.1:{port}");
        let (status, body) = request(
            API,
            "POST",
            "/proxies",
            Some(&json!({"name": name, "listen": listen, "upstream": upstream, "enabled": true})),
        )
        .await?;
        ensure!(
            status == 201 || status == 200,
            "creating proxy {name}: {status} {body}"
        );
        Ok(Self {
            name: name.to_owned(),
            listen,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.listen)
    }

    /// Enabled: forwards. Disabled: its port refuses connections.
    pub async fn set_enabled(&self, enabled: bool) -> Result<()> {
        let (status, body) = request(
            API,
            "PATCH",
            &format!("/proxies/{}", self.name),
            Some(&json!({"enabled": enabled})),
        )
        .await?;
        ensure!(status == 200, "updating proxy {}: {status} {body}", self.name);
        Ok(())
    }

    /// Forwards requests but holds the responses for a minute: the provider did the work,
    /// the caller's attempt times out first. (A downstream `timeout` toxic would not do:
    /// moto closes each connection after answering and toxiproxy passes the close on.)
    pub async fn delay_responses(&self) -> Result<()> {
        self.add_toxic(
            "slow-responses",
            "latency",
            "downstream",
            json!({"latency": 60_000}),
        )
        .await
    }

    pub async fn add_toxic(
        &self,
        name: &str,
        kind: &str,
        stream: &str,
        attributes: serde_json::Value,
    ) -> Result<()> {
        let (status, body) = request(
            API,
            "POST",
            &format!("/proxies/{}/toxics", self.name),
            Some(&json!({"name": name, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes})),
        )
        .await?;
        ensure!(
            status == 200,
            "adding toxic {name} to {}: {status} {body}",
            self.name
        );
        Ok(())
    }

    pub async fn remove_toxic(&self, name: &str) -> Result<()> {
        let (status, body) = request(
            API,
            "DELETE",
            &format!("/proxies/{}/toxics/{name}", self.name),
            None,
        )
        .await?;
        ensure!(
            status == 204 || status == 200,
            "removing toxic {name}: {status} {body}"
        );
        Ok(())
    }

    pub async fn delete(&self) -> Result<()> {
        request(API, "DELETE", &format!("/proxies/{}", self.name), None).await?;
        Ok(())
    }
}
