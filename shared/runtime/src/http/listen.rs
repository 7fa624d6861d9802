//! Binding a listener with a listen backlog of Skyport's choosing.
//!
//! `TcpListener::bind` listens with a backlog of 128 connections (mio's
//! choice). A spike on new connections overflows it: the kernel drops the
//! handshakes past it and the clients send their SYN again after a second,
//! so a burst of 2,000 fresh connections ended with a one-second tail. Every
//! listener Skyport opens asks for `gateway.listen_backlog` instead.

use std::net::SocketAddr;
use std::sync::Once;

use tokio::net::{TcpListener, TcpSocket};

/// Where Linux keeps the most a listen backlog may be: a larger one is cut to it.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// Binds `address` and listens with room for `backlog` connections that
/// have finished their handshake and wait to be accepted. Says so once in
/// the log when the kernel keeps fewer (`net.core.somaxconn`).
///
/// # Errors
/// When the socket cannot be made, bound or put to listen.
pub fn listen(address: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    warn_when_capped(backlog);
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does on Unix: a restarted process binds its port
    // again at once, while connections of the old one are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(backlog)
}

fn warn_when_capped(backlog: u32) {
    static ONCE: Once = Once::new();
    let Some(cap) = std::fs::read_to_string(SOMAXCONN)
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
    else {
        return;
    };
    if cap < backlog {
        ONCE.call_once(|| {
            tracing::warn!(
                listen_backlog = backlog,
                somaxconn = cap,
                "The kernel keeps at most net.core.somaxconn connections waiting on each \
                 listener, fewer than gateway.listen_backlog: raise the sysctl for spikes \
                 on new connections."
            );
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Connections to a listener that accepts none yet: all of them finish
    /// their handshake at once, where the backlog of 128 `TcpListener::bind`
    /// asks for kept 129 and left the rest to send their SYN again a second
    /// later.
    #[tokio::test]
    async fn a_burst_of_connections_waits_in_the_backlog_while_nothing_accepts() {
        const BURST: usize = 900;
        let cap: usize = std::fs::read_to_string(SOMAXCONN)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            cap > BURST,
            "net.core.somaxconn is {cap}: the kernel cuts every backlog to it"
        );
        let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0)), 4_096).unwrap();
        let address = listener.local_addr().unwrap();
        let mut connects = tokio::task::JoinSet::new();
        for _ in 0..BURST {
            connects.spawn(tokio::net::TcpStream::connect(address));
        }
        let connected =
            tokio::time::timeout(std::time::Duration::from_millis(900), connects.join_all())
                .await
                .expect("every handshake within 900 ms, with nothing accepted");
        let locals: Vec<SocketAddr> = connected
            .iter()
            .map(|stream| stream.as_ref().unwrap().local_addr().unwrap())
            .collect();
        let (_, peer) = listener.accept().await.unwrap();
        assert!(locals.contains(&peer));
    }

    #[tokio::test]
    async fn a_port_in_use_is_an_error() {
        let first = listen(SocketAddr::from(([127, 0, 0, 1], 0)), 16).unwrap();
        let taken = first.local_addr().unwrap();
        let error = listen(taken, 16).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
    }
}
