//! Checks against listeners of the test on 127.0.0.1 (real time, short timeouts). The
//! command check goes through the Incus trait: see the fake's tests in tests/integration.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::model::{Probe, ReadySpec};

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A listener that answers every request with `answer` (a status line and headers), or, with
/// `None`, reads the request and never answers.
async fn server(answer: Option<&'static str>) -> u16 {
    let listener = TcpListener::bind((LOCAL, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                match answer {
                    Some(a) => {
                        let _ = stream.write_all(a.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            });
        }
    });
    port
}

/// A port nothing listens on (bound, then let go).
async fn closed_port() -> u16 {
    let listener = TcpListener::bind((LOCAL, 0)).await.unwrap();
    listener.local_addr().unwrap().port()
}

fn http(port: u16) -> ReadySpec {
    ReadySpec {
        timeout: Duration::from_millis(500),
        ..ReadySpec::with_probe(Probe::Http {
            port,
            path: "/healthz".into(),
        })
    }
}

fn tcp_spec(port: u16) -> ReadySpec {
    ReadySpec {
        timeout: Duration::from_millis(500),
        ..ReadySpec::with_probe(Probe::Tcp { port })
    }
}

async fn check(spec: &ReadySpec, address: Option<IpAddr>) -> Outcome {
    let checker = Checker::new().unwrap();
    let target = Target {
        project: "default",
        name: "web-1",
        address,
    };
    checker.check(&NoIncus, target, spec).await
}

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
const UNAVAILABLE: &str =
    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
const MOVED: &str =
    "HTTP/1.1 302 Found\r\nlocation: http://192.0.2.1/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

#[tokio::test]
async fn http_2xx_and_3xx_pass_others_fail() {
    let port = server(Some(OK)).await;
    assert_eq!(check(&http(port), Some(LOCAL)).await, Ok("HTTP 200".into()));
    let port = server(Some(UNAVAILABLE)).await;
    assert_eq!(
        check(&http(port), Some(LOCAL)).await,
        Err("HTTP 503".into())
    );
    // A redirect is not followed (its target is elsewhere): the answer passes.
    let port = server(Some(MOVED)).await;
    assert_eq!(check(&http(port), Some(LOCAL)).await, Ok("HTTP 302".into()));
}

#[tokio::test]
async fn http_refused_and_timed_out() {
    let port = closed_port().await;
    assert_eq!(
        check(&http(port), Some(LOCAL)).await,
        Err("connection refused".into())
    );
    let port = server(None).await;
    assert_eq!(
        check(&http(port), Some(LOCAL)).await,
        Err("timed out after 500ms".into())
    );
}

#[tokio::test]
async fn http_over_ipv6_when_the_host_has_it() {
    let Ok(listener) = TcpListener::bind("[::1]:0").await else {
        return; // no IPv6 here
    };
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = stream.read(&mut buf).await;
        let _ = stream.write_all(OK.as_bytes()).await;
    });
    let v6: IpAddr = "::1".parse().unwrap();
    assert_eq!(check(&http(port), Some(v6)).await, Ok("HTTP 200".into()));
}

#[tokio::test]
async fn tcp_connects_or_is_refused() {
    let port = server(None).await;
    assert_eq!(
        check(&tcp_spec(port), Some(LOCAL)).await,
        Ok("connected".into())
    );
    let port = closed_port().await;
    assert_eq!(
        check(&tcp_spec(port), Some(LOCAL)).await,
        Err("connection refused".into())
    );
}

#[tokio::test]
async fn no_address_no_network_check() {
    assert_eq!(
        check(&http(80), None).await,
        Err("no address on eth0 yet".into())
    );
    let spec = ReadySpec {
        interface: "eth1".into(),
        ..tcp_spec(80)
    };
    assert_eq!(
        check(&spec, None).await,
        Err("no address on eth1 yet".into())
    );
}

#[test]
fn io_errors_in_a_few_words() {
    use std::io::{Error, ErrorKind};
    assert_eq!(
        io_why(&Error::from(ErrorKind::ConnectionRefused)),
        "connection refused"
    );
    assert_eq!(io_why(&Error::from_raw_os_error(113)), "no route to host");
    assert!(io_why(&Error::from_raw_os_error(1)).contains("systemd unit"));
    let _ = SocketAddr::new(LOCAL, 1);
}

/// An Incus that is never asked (network checks do not use it).
struct NoIncus;

#[async_trait::async_trait]
impl crate::incus::Incus for NoIncus {
    async fn server_version(&self) -> Result<String, crate::incus::IncusError> {
        unreachable!()
    }
    async fn list(&self, _: &str) -> Result<Vec<crate::incus::Instance>, crate::incus::IncusError> {
        unreachable!()
    }
    async fn list_by_config(
        &self,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<Vec<crate::incus::Instance>, crate::incus::IncusError> {
        unreachable!()
    }
    async fn get(
        &self,
        _: &str,
        _: &str,
    ) -> Result<Option<crate::incus::Instance>, crate::incus::IncusError> {
        unreachable!()
    }
    async fn create(
        &self,
        _: &str,
        _: &crate::incus::CreateInstance,
    ) -> Result<(), crate::incus::IncusError> {
        unreachable!()
    }
    async fn change_state(
        &self,
        _: &str,
        _: &str,
        _: crate::incus::StateChange,
    ) -> Result<(), crate::incus::IncusError> {
        unreachable!()
    }
    async fn exec(&self, _: &str, _: &str, _: &[String]) -> Result<i64, crate::incus::IncusError> {
        unreachable!()
    }
    async fn delete(&self, _: &str, _: &str) -> Result<(), crate::incus::IncusError> {
        unreachable!()
    }
    async fn set_config(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<(), crate::incus::IncusError> {
        unreachable!()
    }
    async fn memory_state(
        &self,
        _: &str,
        _: &str,
    ) -> Result<Option<crate::model::Memory>, crate::incus::IncusError> {
        unreachable!()
    }
    async fn addresses(
        &self,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<Vec<IpAddr>, crate::incus::IncusError> {
        unreachable!()
    }
    async fn memory_metrics(
        &self,
        _: &str,
        _: Option<&str>,
    ) -> Result<std::collections::HashMap<String, crate::model::Memory>, crate::incus::IncusError>
    {
        unreachable!()
    }
    async fn host_memory(
        &self,
        _: Option<&str>,
    ) -> Result<crate::incus::HostMemory, crate::incus::IncusError> {
        unreachable!()
    }
    async fn cluster_members(
        &self,
    ) -> Result<Vec<crate::incus::ClusterMember>, crate::incus::IncusError> {
        unreachable!()
    }
    async fn leases(&self, _: &str) -> Result<crate::incus::LeaseHome, crate::incus::IncusError> {
        unreachable!()
    }
    async fn put_leases(
        &self,
        _: &str,
        _: &crate::incus::LeaseHome,
    ) -> Result<bool, crate::incus::IncusError> {
        unreachable!()
    }
}
