//! Accepting connections in the background: one thread blocks in `accept` and hands each
//! connection to a handler on a thread of its own, so a peer that connects and sends nothing
//! stalls nobody. At most [`MAX_PENDING`] connections may be unproven (not yet past their first
//! frame) at once; more are dropped on arrival, so a flood cannot exhaust threads.
use super::link::log;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections that may be waiting for their first frame at once.
pub(crate) const MAX_PENDING: usize = 256;

/// A place among the [`MAX_PENDING`] unproven connections; dropping it frees the place.
pub(crate) struct PendingSlot(Arc<AtomicUsize>);

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the acceptor does with a connection: runs on its own thread.
pub(crate) type Handler = Arc<dyn Fn(TcpStream, SocketAddr, PendingSlot) + Send + Sync>;

/// A listener served by a background thread until dropped.
pub(crate) struct Acceptor {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    /// Serves `listener` (whose address others reach at `addr`) with `handler`.
    pub fn spawn(
        listener: TcpListener,
        addr: SocketAddr,
        name: String,
        handler: Handler,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || accept_loop(listener, &name, &stop2, handler))?;
        Ok(Acceptor { addr, stop, thread: Some(thread) })
    }

    /// Stops accepting: wakes the thread with a connection of its own, then joins it.
    pub fn stop(&mut self) {
        let Some(t) = self.thread.take() else { return };
        self.stop.store(true, Ordering::Release);
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        let woken = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        // Refused: another connection woke the thread first and it has closed the listener.
        let gone = Instant::now() + Duration::from_millis(100);
        while woken.is_err() && !t.is_finished() && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(1));
        }
        match woken {
            Err(e) if !t.is_finished() => {
                // Not joined: the thread ends at the next connection that arrives.
                log(format_args!("listener at {} not woken to stop: {e}", self.addr))
            }
            _ => {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, name: &str, stop: &AtomicBool, handler: Handler) {
    let pending = Arc::new(AtomicUsize::new(0));
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::Acquire) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors and the like: say so, and do not spin.
                log(format_args!("{name}: accept failed: {e}"));
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            pending.fetch_sub(1, Ordering::AcqRel);
            log(format_args!(
                "{name}: refused connection from {peer}: {MAX_PENDING} connections already pending"
            ));
            continue;
        }
        let slot = PendingSlot(pending.clone());
        let h = handler.clone();
        let _ = stream.set_nodelay(true);
        if let Err(e) =
            std::thread::Builder::new().name(format!("{name}-conn")).spawn(move || h(stream, peer, slot))
        {
            log(format_args!("{name}: dropped connection from {peer}: no thread: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn unproven_connections_are_capped_and_the_acceptor_stops() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let s2 = served.clone();
        // Each handler keeps its slot until its peer closes.
        let handler: Handler = Arc::new(move |mut s: TcpStream, _, _slot: PendingSlot| {
            s2.fetch_add(1, Ordering::SeqCst);
            let _ = s.read(&mut [0u8; 1]);
        });
        let mut a = Acceptor::spawn(l, addr, "test-acceptor".into(), handler).unwrap();
        let conns: Vec<TcpStream> = (0..MAX_PENDING + 8).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let start = Instant::now();
        while served.load(Ordering::SeqCst) < MAX_PENDING && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(served.load(Ordering::SeqCst), MAX_PENDING);
        drop(conns);
        // Slots free again: a new connection is served.
        let start = Instant::now();
        loop {
            let _c = TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            if served.load(Ordering::SeqCst) > MAX_PENDING {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "slots never freed");
        }
        a.stop();
        assert!(a.thread.is_none());
        // Nothing serves the address any more. (A connect may still succeed: a test running
        // beside this one can bind the freed port; but this acceptor never sees it.)
        let before = served.load(Ordering::SeqCst);
        if let Ok(_c) = TcpStream::connect(addr) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(served.load(Ordering::SeqCst), before);
    }
}
