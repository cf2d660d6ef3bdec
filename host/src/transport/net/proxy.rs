//! The proxy thread: the host side of every network connection of one rank (NCCL's
//! `proxy.cc` + `net.cc` progress functions).
//!
//! **Sending side.** The kernel fills FIFO slots, writes the slice's byte count into the `sizes`
//! FIFO at its first step and advances `tail`. The proxy sends, for each slice the tail covers,
//! a [`Ctrl`] (first step, steps covered, bytes) and then the bytes straight from the slot, and
//! advances `head` (the kernel's credit) when the plugin reports the send done. A slice's first
//! step is the one with a size: the others the tail passed are its continuation, or steps the
//! kernel skipped when it aligned its step at launch, which ride along with the next slice.
//!
//! **Receiving side.** The proxy receives a `Ctrl`, waits until the kernel has freed the slots
//! it covers (`head`), receives the bytes straight into them and advances `tail`.
//!
//! **Call signatures** (`prims::signature`) cross as control messages of their own: the
//! sending proxy sends the one its kernel wrote for the call starting at step `s` before any
//! slice from `s` on (and at once when it finds one with nothing else to send, since a
//! receiver checks it before it moves any data); the receiving proxy writes it in its kernel's
//! slot of `s` once that slot is free, as for data. A receiving kernel that refuses the
//! sender's call (`CONN_REFUSED` in its head word) gets nothing more on that connection.
//!
//! **LL and LL128 regions** ([`Region::Ll`], [`Region::Ll128`]) move one step at a time, as
//! NCCL's `net.cc` moves them: the kernel writes a step's size before its lines
//! (`CONN_PROXY_SIZES`); LL fences nothing after them, so the sending proxy sends the step
//! once every line of it carries the step's flag; LL128 fences before its tail, and the proxy
//! waits for both the tail and the flags (NCCL's check for LL128 FIFOs in host memory). The
//! receiving proxy takes the step into a buffer of its own and stores it into the slot so that
//! the kernel never sees a flag without its data: LL in whole 8-byte words (a flag shares its
//! word with its data), LL128 line by line with the flag word stored last (release).
//!
//! A broken connection (the peer died or closed it, garbage, a plugin error) stops that
//! connection, records which peer it was for the communicator to report, and sets the abort word
//! so that the rank's kernels stop waiting at once. Dropping the [`Proxy`] stops the thread and
//! closes every connection.
use super::wire::{Ctrl, CTRL_BYTES};
use super::{NetRecvComm, NetRequest, NetSendComm, Region, NO_SIZE};
use crate::backend::HostMapped;
use crate::error::{Error, Result};
use crate::transport::{ConnLayout, Side};
use rsccl_device::prims::conn::{CALL_SIG_BYTES, CONN_REFUSED, NCCL_STEPS};
use rsccl_device::prims::ll::{ll_flag, LlLine, LL_LINE_BYTES};
use rsccl_device::prims::ll128::{ll128_flag, LL128_DATA_ELEMS, LL128_LINE_BYTES, LL128_LINE_ELEMS};
use rsccl_device::DevPtr;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A connection's plugin side.
pub(crate) enum Comm {
    Send(Box<dyn NetSendComm>),
    Recv(Box<dyn NetRecvComm>),
}

/// The words of one side of a connection, as host addresses.
struct Words {
    fifo: *mut u8,
    head: *const AtomicU64,
    tail: *const AtomicU64,
    sizes: *const AtomicU64,
    /// The call signatures: `NCCL_STEPS` slots of four words.
    sigs: *const AtomicU64,
    step_bytes: u64,
}

impl Words {
    fn of(mem: &HostMapped, layout: ConnLayout, region: Region, side: Side) -> Words {
        let v = region.view(layout, DevPtr(mem.host_ptr() as u64), side, 0);
        Words {
            fifo: v.buff.0 as *mut u8,
            head: v.head.0 as *const AtomicU64,
            tail: v.tail.0 as *const AtomicU64,
            sizes: v.sizes_fifo.0 as *const AtomicU64,
            sigs: v.sig.0 as *const AtomicU64,
            step_bytes: v.step_bytes,
        }
    }
    fn head(&self) -> &AtomicU64 {
        // SAFETY: inside the connection's memory (ConnLayout::view), 8-aligned, alive as long as
        // the ProxyConn holding the HostMapped.
        unsafe { &*self.head }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as head.
        unsafe { &*self.tail }
    }
    fn size(&self, step: u64) -> &AtomicU64 {
        // SAFETY: the sizes FIFO has NCCL_STEPS words inside the connection's memory.
        unsafe { &*self.sizes.add((step % NCCL_STEPS) as usize) }
    }
    fn slot(&self, step: u64) -> *mut u8 {
        // SAFETY: slot step % NCCL_STEPS is inside the FIFO.
        unsafe { self.fifo.add(((step % NCCL_STEPS) * self.step_bytes) as usize) }
    }
    /// The four words of step's signature slot (the call number first).
    fn sig(&self, step: u64) -> &[AtomicU64; 4] {
        const _: () = assert!(CALL_SIG_BYTES == 32);
        // SAFETY: NCCL_STEPS slots of CALL_SIG_BYTES (four 8-aligned words) inside the
        // connection's memory (ConnLayout::view), alive as long as the ProxyConn.
        unsafe { &*(self.sigs.add(4 * (step % NCCL_STEPS) as usize) as *const [AtomicU64; 4]) }
    }
    /// The signature the kernel wrote in step's slot if it is newer than call `sent`.
    fn new_sig(&self, step: u64, sent: u64) -> Option<[u64; 4]> {
        let w = self.sig(step);
        // The kernel writes the call number last, after a fence: read it first.
        let seq = w[0].load(Ordering::Acquire);
        (seq > sent).then(|| {
            [seq, w[1].load(Ordering::Relaxed), w[2].load(Ordering::Relaxed), w[3].load(Ordering::Relaxed)]
        })
    }
    /// Writes a signature received for step's slot, its call number last.
    fn put_sig(&self, step: u64, sig: [u64; 4]) {
        let w = self.sig(step);
        for i in 1..4 {
            w[i].store(sig[i], Ordering::Relaxed);
        }
        w[0].store(sig[0], Ordering::Release);
    }
    /// Whether the receiving kernel has freed the slots of every step before `end` (its credit,
    /// `head`); `None` when it refused the sender's call.
    fn freed(&self, end: u64) -> Option<bool> {
        let head = self.head().load(Ordering::Acquire);
        (head != CONN_REFUSED).then(|| end <= head.saturating_add(NCCL_STEPS))
    }
    /// Bytes from step's slot to the end of the FIFO.
    fn room(&self, step: u64) -> u64 {
        (NCCL_STEPS - step % NCCL_STEPS) * self.step_bytes
    }
    /// Word `i` of step's slot.
    fn slot_word(&self, step: u64, i: usize) -> &AtomicU64 {
        // SAFETY: callers keep `8 · i` below `step_bytes` (a slice's bytes, checked against
        // it); slots are 16-byte aligned inside the connection's memory.
        unsafe { &*(self.slot(step) as *const AtomicU64).add(i) }
    }
    /// Whether the first `bytes` of step's slot of a line-protocol `region` are whole lines
    /// of that step: LL, both flags of every line are its flag (the kernel stores each line's
    /// halves with no fence after); LL128, every line's flag word is.
    fn lines_ready(&self, region: Region, step: u64, bytes: u64) -> bool {
        match region {
            Region::Ll => {
                let flag = ll_flag(step);
                (0..(bytes / LL_LINE_BYTES) as usize).all(|l| {
                    let h = [
                        self.slot_word(step, 2 * l).load(Ordering::Acquire),
                        self.slot_word(step, 2 * l + 1).load(Ordering::Acquire),
                    ];
                    let line = LlLine::from_halves(h);
                    line.flag1 == flag && line.flag2 == flag
                })
            }
            Region::Ll128 => {
                let (flag, elems) = (ll128_flag(step), LL128_LINE_ELEMS as usize);
                (0..(bytes / LL128_LINE_BYTES) as usize).all(|l| {
                    self.slot_word(step, l * elems + LL128_DATA_ELEMS as usize).load(Ordering::Acquire)
                        == flag
                })
            }
            Region::Simple => unreachable!("Simple slices are announced by the tail"),
        }
    }

    /// Stores a received step of a line-protocol `region` (`words`, whole lines) into step's
    /// slot so that the kernel never sees a flag before its data: LL word by word (each flag
    /// shares its word with its data), LL128 line by line, each line's flag word last.
    fn land(&self, region: Region, step: u64, words: &[u64]) {
        if region == Region::Ll128 {
            for (l, line) in words.chunks(LL128_LINE_ELEMS as usize).enumerate() {
                let at = l * LL128_LINE_ELEMS as usize;
                for (i, w) in line.iter().enumerate() {
                    let order =
                        if i == LL128_DATA_ELEMS as usize { Ordering::Release } else { Ordering::Relaxed };
                    self.slot_word(step, at + i).store(*w, order);
                }
            }
        } else {
            for (i, w) in words.iter().enumerate() {
                self.slot_word(step, i).store(*w, Ordering::Relaxed);
            }
        }
    }
}

/// A send in flight: its two requests (None once done) and the step its credit reaches.
struct InFlight {
    ctrl: Option<NetRequest>,
    data: Option<NetRequest>,
    end: u64,
}

/// Where a receiving connection is. Control messages alternate between two buffers: the next
/// one is posted as soon as a slice's bytes are, so the plugin already holds it when they end
/// (no round trip through the proxy between two slices).
enum RecvState {
    Idle,
    /// The sender said goodbye: nothing more will come.
    Closed,
    /// A control message is being received into buffer `.1`.
    Ctrl(NetRequest, usize),
    /// A slice's control message (from buffer `.1`) received: (step, steps, bytes); waiting for
    /// the kernel to free its slots.
    Slots((u64, u64, u64), usize),
    /// A signature (from buffer `.2`) for step `.0`'s slot: waiting for the kernel to free it.
    Sign(u64, [u64; 4], usize),
    /// The slice's bytes are being received, and the next control message into buffer `.3`.
    Data(NetRequest, (u64, u64, u64), NetRequest, usize),
    /// The kernel refused the sender's call (its signature differs): nothing more is read.
    Refused,
}

/// One network connection as the proxy drives it.
pub(crate) struct ProxyConn {
    peer: usize,
    host: String,
    region: Region,
    words: Words,
    /// A receiving line-protocol region's landing buffer: one step, copied into the slot
    /// ([`Words::land`]).
    stage: Box<[u64]>,
    comm: Comm,
    /// Sending: the first step not sent yet. Receiving: the first step not received yet.
    next: u64,
    inflight: VecDeque<InFlight>,
    /// Control messages being sent (one per slice in flight) or received.
    ctrl: Box<[[u8; CTRL_BYTES]; NCCL_STEPS as usize]>,
    sent: u64,
    /// Sending: the last call whose signature was sent.
    sig_sent: u64,
    recv: RecvState,
    dead: bool,
    /// Keeps the memory the words point into alive.
    _mem: Arc<HostMapped>,
}

// SAFETY: the raw word pointers point into `_mem`, which the ProxyConn owns a share of; they
// are only used through atomics and by the plugin under its isend/irecv contract.
unsafe impl Send for ProxyConn {}

impl ProxyConn {
    pub(crate) fn new(
        peer: usize,
        host: String,
        layout: ConnLayout,
        region: Region,
        mem: Arc<HostMapped>,
        mut comm: Comm,
    ) -> Result<Self> {
        let side = match comm {
            Comm::Send(_) => Side::Send,
            Comm::Recv(_) => Side::Recv,
        };
        let ctrl: Box<[[u8; CTRL_BYTES]; NCCL_STEPS as usize]> =
            Box::new([[0; CTRL_BYTES]; NCCL_STEPS as usize]);
        let words = Words::of(&mem, layout, region, side);
        let stage_words = match (region, side) {
            (Region::Ll | Region::Ll128, Side::Recv) => {
                usize::try_from(words.step_bytes / 8).map_err(|_| {
                    Error::InvalidConfig(format!("{} slots of {} bytes", region.name(), words.step_bytes))
                })?
            }
            _ => 0,
        };
        let mut stage = Vec::new();
        stage.try_reserve_exact(stage_words).map_err(|_| {
            Error::InvalidConfig(format!(
                "no memory for a {}-byte {} landing buffer",
                words.step_bytes,
                region.name()
            ))
        })?;
        stage.resize(stage_words, 0u64);
        let stage = stage.into_boxed_slice();
        // What the plugin sends from and receives into: the connection's memory, the control
        // buffers and the landing buffer, registered once.
        let regions = [
            (mem.host_ptr() as *const u8, mem.len()),
            (ctrl.as_ptr().cast::<u8>(), std::mem::size_of_val(&*ctrl)),
            (stage.as_ptr().cast::<u8>(), std::mem::size_of_val(&*stage)),
        ];
        for (p, len) in regions.into_iter().filter(|r| r.1 != 0) {
            match &mut comm {
                Comm::Send(c) => c.register(p, len)?,
                Comm::Recv(c) => c.register(p, len)?,
            }
        }
        Ok(ProxyConn {
            peer,
            host,
            region,
            words,
            stage,
            comm,
            next: 0,
            inflight: VecDeque::new(),
            ctrl,
            sent: 0,
            sig_sent: 0,
            recv: RecvState::Idle,
            dead: false,
            _mem: mem,
        })
    }

    /// Moves what it can without blocking; true when something moved.
    fn progress(&mut self) -> std::result::Result<bool, String> {
        match (&mut self.comm, self.region) {
            (Comm::Send(_), Region::Simple) => self.progress_send(),
            (Comm::Send(_), Region::Ll | Region::Ll128) => self.progress_send_lines(),
            (Comm::Recv(_), _) => self.progress_recv(),
        }
    }

    /// Sends done, in order: each gives the kernel credit up to its end. True when one ended.
    fn complete_sends(&mut self) -> std::result::Result<bool, String> {
        let Comm::Send(comm) = &mut self.comm else { unreachable!("a send connection") };
        let mut moved = false;
        while let Some(f) = self.inflight.front_mut() {
            for r in [&mut f.ctrl, &mut f.data] {
                if let Some(req) = *r {
                    if comm.test(req).map_err(|e| e.to_string())?.is_some() {
                        *r = None;
                    }
                }
            }
            if f.ctrl.is_some() || f.data.is_some() {
                break;
            }
            self.words.head().store(f.end, Ordering::Release);
            self.inflight.pop_front();
            moved = true;
        }
        Ok(moved)
    }

    /// Sends `sig`, the signature of the call starting at step `self.next`.
    fn send_sig(&mut self, sig: [u64; 4]) -> std::result::Result<(), String> {
        let Comm::Send(comm) = &mut self.comm else { unreachable!("a send connection") };
        let k = (self.sent % NCCL_STEPS) as usize;
        self.ctrl[k] = Ctrl::Sign { step: self.next, sig }.encode();
        // SAFETY: the control buffer is ours until this send is done (at most NCCL_STEPS in
        // flight).
        let c = unsafe { comm.isend(self.ctrl[k].as_ptr(), CTRL_BYTES) }.map_err(|e| e.to_string())?;
        self.inflight.push_back(InFlight { ctrl: Some(c), data: None, end: self.next });
        self.sent += 1;
        self.sig_sent = sig[0];
        Ok(())
    }

    /// A line-protocol region's sends: step by step, each once the kernel has written its size
    /// and all of its lines carry the step's flag — LL128 also once the kernel's tail (stored
    /// after a fence) has passed it; LL's tail, stored with no fence after the lines, says
    /// nothing.
    fn progress_send_lines(&mut self) -> std::result::Result<bool, String> {
        let region = self.region;
        let line = region.line_bytes().expect("a line-protocol region");
        let mut moved = self.complete_sends()?;
        while self.inflight.len() < NCCL_STEPS as usize {
            let s = self.next;
            // The size first: the kernel fenced before storing it, so a signature of the call
            // starting here is visible once it is.
            let bytes = self.words.size(s).load(Ordering::Acquire);
            if let Some(sig) = self.words.new_sig(s, self.sig_sent) {
                self.send_sig(sig)?;
                moved = true;
                continue;
            }
            if bytes == NO_SIZE {
                break;
            }
            if bytes > self.words.step_bytes || !bytes.is_multiple_of(line) {
                return Err(format!(
                    "the kernel wrote an {} step of {bytes} bytes at step {s} (whole {line}-byte lines of a \
                     {}-byte slot expected)",
                    region.name(),
                    self.words.step_bytes
                ));
            }
            if region == Region::Ll128 && self.words.tail().load(Ordering::Acquire) <= s {
                break;
            }
            if !self.words.lines_ready(region, s, bytes) {
                break;
            }
            self.words.size(s).store(NO_SIZE, Ordering::Release);
            let Comm::Send(comm) = &mut self.comm else { unreachable!("a send connection") };
            let k = (self.sent % NCCL_STEPS) as usize;
            self.ctrl[k] = Ctrl::Slice { step: s, steps: 1, bytes }.encode();
            // SAFETY: as progress_send: the control buffer is ours until the send is done, and
            // the kernel rewrites the slot only after the head store that completion makes.
            let (c, d) = unsafe {
                (
                    comm.isend(self.ctrl[k].as_ptr(), CTRL_BYTES),
                    comm.isend(self.words.slot(s), bytes as usize),
                )
            };
            let (c, d) = (c.map_err(|e| e.to_string())?, d.map_err(|e| e.to_string())?);
            self.inflight.push_back(InFlight { ctrl: Some(c), data: Some(d), end: s + 1 });
            self.sent += 1;
            self.next = s + 1;
            moved = true;
        }
        Ok(moved)
    }

    fn progress_send(&mut self) -> std::result::Result<bool, String> {
        let mut moved = self.complete_sends()?;
        let Comm::Send(comm) = &mut self.comm else { unreachable!("a send connection") };
        // New signatures and slices.
        let tail = self.words.tail().load(Ordering::Acquire);
        while self.inflight.len() < NCCL_STEPS as usize {
            let k = (self.sent % NCCL_STEPS) as usize;
            // A call's signature goes before its first slice (and on its own when the kernel
            // has nothing else for this connection yet: the receiver checks it first).
            if let Some(sig) = self.words.new_sig(self.next, self.sig_sent) {
                self.ctrl[k] = Ctrl::Sign { step: self.next, sig }.encode();
                // SAFETY: the control buffer is ours until this send is done (at most
                // NCCL_STEPS in flight).
                let c =
                    unsafe { comm.isend(self.ctrl[k].as_ptr(), CTRL_BYTES) }.map_err(|e| e.to_string())?;
                self.inflight.push_back(InFlight { ctrl: Some(c), data: None, end: self.next });
                self.sent += 1;
                self.sig_sent = sig[0];
                moved = true;
                continue;
            }
            // The slice's first step is the first with a size; the steps before it are ones
            // the kernel skipped when it aligned its step at launch. A later call's signature
            // stops the search: it goes first.
            let mut s = self.next;
            let later_call = |s: u64| s > self.next && self.words.new_sig(s, self.sig_sent).is_some();
            while s < tail && !later_call(s) && self.words.size(s).load(Ordering::Acquire) == NO_SIZE {
                s += 1;
            }
            if later_call(s) {
                self.next = s;
                continue;
            }
            if s == tail {
                break; // Skipped steps: they go with the next slice.
            }
            let bytes = self.words.size(s).swap(NO_SIZE, Ordering::AcqRel);
            let mut end = s + 1;
            while end < tail
                && end - s < NCCL_STEPS
                && self.words.size(end).load(Ordering::Acquire) == NO_SIZE
                && self.words.new_sig(end, self.sig_sent).is_none()
            {
                end += 1;
            }
            if bytes > self.words.room(s) {
                return Err(format!(
                    "the kernel wrote a slice of {bytes} bytes at step {s}, more than the {} bytes left in the FIFO",
                    self.words.room(s)
                ));
            }
            self.ctrl[k] = Ctrl::Slice { step: s, steps: end - s, bytes }.encode();
            // SAFETY: the control buffer is ours and not reused until this slice is done (at
            // most NCCL_STEPS in flight); the slot holds `bytes` bytes the kernel wrote before
            // advancing tail, and it will not rewrite them before the head store above.
            let (c, d) = unsafe {
                (
                    comm.isend(self.ctrl[k].as_ptr(), CTRL_BYTES),
                    comm.isend(self.words.slot(s), bytes as usize),
                )
            };
            let (c, d) = (c.map_err(|e| e.to_string())?, d.map_err(|e| e.to_string())?);
            self.inflight.push_back(InFlight { ctrl: Some(c), data: Some(d), end });
            self.sent += 1;
            self.next = end;
            moved = true;
        }
        Ok(moved)
    }

    fn progress_recv(&mut self) -> std::result::Result<bool, String> {
        let Comm::Recv(comm) = &mut self.comm else { unreachable!("a receive connection") };
        let mut moved = false;
        loop {
            match std::mem::replace(&mut self.recv, RecvState::Idle) {
                RecvState::Closed => {
                    self.recv = RecvState::Closed;
                    return Ok(moved);
                }
                RecvState::Refused => {
                    self.recv = RecvState::Refused;
                    return Ok(moved);
                }
                RecvState::Idle => {
                    // SAFETY: the control buffer is ours until the request is done.
                    let r = unsafe { comm.irecv(self.ctrl[0].as_mut_ptr(), CTRL_BYTES) };
                    self.recv = RecvState::Ctrl(r.map_err(|e| e.to_string())?, 0);
                }
                RecvState::Ctrl(req, i) => match comm.test(req).map_err(|e| e.to_string())? {
                    None => {
                        self.recv = RecvState::Ctrl(req, i);
                        return Ok(moved);
                    }
                    Some(n) if n != CTRL_BYTES => return Err(format!("a control message of {n} bytes")),
                    Some(_) => {
                        let c =
                            Ctrl::decode(&self.ctrl[i], self.next, self.words.step_bytes).map_err(|e| e.0)?;
                        self.recv = match c {
                            Ctrl::Goodbye => {
                                tracing::debug!(
                                    "network: rank {} on {} closed its connection in order",
                                    self.peer,
                                    self.host
                                );
                                self.recv = RecvState::Closed;
                                return Ok(true);
                            }
                            Ctrl::Slice { step, steps, bytes } => {
                                let line = self.region.line_bytes();
                                if line.is_some_and(|line| {
                                    steps != 1 || !bytes.is_multiple_of(line) || bytes > self.words.step_bytes
                                }) {
                                    return Err(format!(
                                        "an {} slice of {bytes} bytes over {steps} steps at step {step} (one step \
                                         of whole {}-byte lines, at most {} bytes, expected)",
                                        self.region.name(),
                                        line.unwrap_or(0),
                                        self.words.step_bytes
                                    ));
                                }
                                RecvState::Slots((step, steps, bytes), i)
                            }
                            Ctrl::Sign { step, sig } => RecvState::Sign(step, sig, i),
                        };
                        moved = true;
                    }
                },
                RecvState::Sign(step, sig, i) => {
                    match self.words.freed(step + 1) {
                        None => {
                            self.refused();
                            return Ok(moved);
                        }
                        Some(false) => {
                            self.recv = RecvState::Sign(step, sig, i);
                            return Ok(moved); // The kernel has not read the slot's last signature.
                        }
                        Some(true) => {}
                    }
                    self.words.put_sig(step, sig);
                    // SAFETY: buffer i is ours: its message was decoded above.
                    let r = unsafe { comm.irecv(self.ctrl[i].as_mut_ptr(), CTRL_BYTES) };
                    self.recv = RecvState::Ctrl(r.map_err(|e| e.to_string())?, i);
                    moved = true;
                }
                RecvState::Slots(c, i) => {
                    let (step, steps, bytes) = c;
                    match self.words.freed(step + steps) {
                        None => {
                            self.refused();
                            return Ok(moved);
                        }
                        Some(false) => {
                            self.recv = RecvState::Slots(c, i);
                            return Ok(moved); // The kernel still reads those slots.
                        }
                        Some(true) => {}
                    }
                    let r = if self.region != Region::Simple {
                        // SAFETY: the landing buffer holds a slot (checked: bytes ≤ step_bytes)
                        // and is only read once this request is done.
                        unsafe { comm.irecv(self.stage.as_mut_ptr().cast(), bytes as usize) }
                    } else {
                        // SAFETY: Ctrl::decode checked the bytes fit from the slot to the FIFO's
                        // end; the kernel released these slots (head) and reads them only after
                        // tail.
                        unsafe { comm.irecv(self.words.slot(step), bytes as usize) }
                    };
                    let data = r.map_err(|e| e.to_string())?;
                    // The next control message goes into the other buffer; this one's is decoded.
                    let j = i ^ 1;
                    // SAFETY: buffer j is ours: the request that used it last is done.
                    let next = unsafe { comm.irecv(self.ctrl[j].as_mut_ptr(), CTRL_BYTES) };
                    self.recv = RecvState::Data(data, c, next.map_err(|e| e.to_string())?, j);
                }
                RecvState::Data(req, c, next, j) => match comm.test(req).map_err(|e| e.to_string())? {
                    None => {
                        self.recv = RecvState::Data(req, c, next, j);
                        return Ok(moved);
                    }
                    Some(n) if n as u64 != c.2 => {
                        return Err(format!("a slice of {n} bytes where {} were announced", c.2))
                    }
                    Some(n) => {
                        if self.region != Region::Simple {
                            self.words.land(self.region, c.0, &self.stage[..n / 8]);
                        }
                        self.words.size(c.0).store(n as u64, Ordering::Relaxed);
                        self.next = c.0 + c.1;
                        self.words.tail().store(self.next, Ordering::Release);
                        self.recv = RecvState::Ctrl(next, j);
                        moved = true;
                    }
                },
            }
        }
    }

    /// The kernel refused the sender's call: receive nothing more (the sender learns it from
    /// its own check, or its credit wait's timeout and the hang report).
    fn refused(&mut self) {
        tracing::debug!(
            "network: rank {} on {}: the kernel refused its call; receiving stops",
            self.peer,
            self.host
        );
        self.recv = RecvState::Refused;
    }

    /// Whether everything the kernel handed this connection has been sent (receiving sides
    /// have nothing to flush).
    fn drained(&self) -> bool {
        match self.comm {
            Comm::Send(_) => {
                self.inflight.is_empty() && self.next >= self.words.tail().load(Ordering::Acquire)
            }
            Comm::Recv(_) => true,
        }
    }

    /// Tells the receiver that nothing more comes (waits at most `until` for the send).
    fn goodbye(&mut self, until: std::time::Instant) {
        let Comm::Send(comm) = &mut self.comm else { return };
        // Every control buffer still in use by an unfinished send (a drain that timed out, or
        // none after a failure): there is none to say goodbye with; the peer sees a lost peer.
        if self.inflight.len() >= NCCL_STEPS as usize {
            return;
        }
        let k = (self.sent % NCCL_STEPS) as usize;
        self.ctrl[k] = Ctrl::Goodbye.encode();
        // SAFETY: the control buffer lives until the loop below sees the send done or the
        // connection is closed (close joins the threads that use it).
        let Ok(req) = (unsafe { comm.isend(self.ctrl[k].as_ptr(), CTRL_BYTES) }) else { return };
        while std::time::Instant::now() < until {
            match comm.test(req) {
                Ok(None) => std::thread::sleep(Duration::from_micros(50)),
                _ => return,
            }
        }
    }

    fn close(&mut self) {
        match &mut self.comm {
            Comm::Send(c) => c.close(),
            Comm::Recv(c) => c.close(),
        }
    }
}

/// What the proxy thread and the communicator share.
struct Shared {
    rank: usize,
    abort: Arc<HostMapped>,
    stop: AtomicBool,
    /// Set with `stop` by a drop: send what the kernels left in the FIFOs first.
    drain: AtomicBool,
    /// Set with `stop` by a drop: say goodbye on every connection before closing it.
    farewell: AtomicBool,
    failure: Mutex<Option<Error>>,
}

/// The proxy thread of one rank and its connections.
pub struct Proxy {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    peers: Vec<(usize, bool)>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Proxy(rank {}, {} connections)", self.shared.rank, self.peers.len())
    }
}

/// How long a dropped proxy keeps sending what its kernels left before it closes anyway.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a dropped proxy waits for its goodbyes to go out.
const GOODBYE_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest sleep of an idle proxy between looks at its connections.
const MAX_IDLE_SLEEP: Duration = Duration::from_micros(100);
/// Idle rounds an idle proxy spins, then yields (up to the second), before it parks.
const IDLE_SPINS: u32 = 64;
const IDLE_YIELDS: u32 = 96;

impl Proxy {
    pub(crate) fn start(rank: usize, abort: Arc<HostMapped>, mut conns: Vec<ProxyConn>) -> Result<Proxy> {
        let shared = Arc::new(Shared {
            rank,
            abort,
            stop: AtomicBool::new(false),
            drain: AtomicBool::new(false),
            farewell: AtomicBool::new(false),
            failure: Mutex::new(None),
        });
        let peers = conns.iter().map(|c| (c.peer, matches!(c.comm, Comm::Send(_)))).collect();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rsccl-proxy-{rank}"))
            .spawn(move || {
                let mut idle = 0u32;
                let mut drain_until = None;
                loop {
                    if sh.stop.load(Ordering::Acquire) {
                        // A collective returns once its kernel wrote the FIFOs: the last slices
                        // may still be here. A drop sends them (bounded); an abort does not.
                        let until =
                            *drain_until.get_or_insert_with(|| std::time::Instant::now() + DRAIN_TIMEOUT);
                        let done = conns.iter().all(|c| c.dead || c.drained());
                        if done || !sh.drain.load(Ordering::Acquire) || std::time::Instant::now() > until {
                            break;
                        }
                    }
                    let mut moved = false;
                    for c in conns.iter_mut().filter(|c| !c.dead) {
                        match c.progress() {
                            Ok(m) => moved |= m,
                            Err(what) => {
                                c.dead = true;
                                sh.fail(c, what);
                            }
                        }
                    }
                    if moved {
                        idle = 0;
                    } else {
                        idle = idle.saturating_add(1);
                        if idle < IDLE_SPINS {
                            std::hint::spin_loop();
                        } else if idle < IDLE_YIELDS {
                            std::thread::yield_now();
                        } else {
                            // The plugin's threads wake it when a request completes; the
                            // kernels' steps are looked at when the timeout ends.
                            std::thread::park_timeout(
                                Duration::from_micros(u64::from(idle - IDLE_YIELDS + 1)).min(MAX_IDLE_SLEEP),
                            );
                        }
                    }
                }
                if sh.farewell.load(Ordering::Acquire) {
                    let until = std::time::Instant::now() + GOODBYE_TIMEOUT;
                    for c in conns.iter_mut().filter(|c| !c.dead) {
                        c.goodbye(until);
                    }
                }
                for c in &mut conns {
                    c.close();
                }
            })
            .map_err(|e| Error::Network(format!("starting the proxy thread: {e}")))?;
        Ok(Proxy { shared, thread: Some(thread), peers })
    }

    /// The first connection failure, if any.
    pub fn failure(&self) -> Option<Error> {
        self.shared.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The connections served: (peer, whether this side sends).
    pub fn connections(&self) -> &[(usize, bool)] {
        &self.peers
    }

    /// Asks the thread to stop and close every connection; returns at once.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
    }

    /// Whether [`Proxy::shutdown`] was called.
    pub fn is_stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    /// Sends what the kernels left in the FIFOs (for at most [`DRAIN_TIMEOUT`]), says goodbye
    /// on every connection, then stops the thread and closes them (also on drop).
    pub fn stop(&mut self) {
        self.stop_with(true);
    }

    /// Stops the thread: `drain` first sends what the kernels left in the FIFOs (pointless
    /// after a failed collective, whose slices no peer reads); either way each connection says
    /// goodbye, so that peers see an orderly close rather than a lost peer. After
    /// [`Proxy::shutdown`] (an abort) neither happens.
    pub fn stop_with(&mut self, drain: bool) {
        if !self.shared.stop.load(Ordering::Acquire) {
            self.shared.drain.store(drain, Ordering::Release);
            self.shared.farewell.store(true, Ordering::Release);
        }
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn fail(&self, c: &ProxyConn, what: String) {
        let dir = if matches!(c.comm, Comm::Send(_)) { "sending to" } else { "receiving from" };
        tracing::warn!(rank = self.rank, "network: {dir} rank {} on {}: {what}", c.peer, c.host);
        let e = Error::PeerLost {
            rank: self.rank,
            peer: c.peer,
            host: c.host.clone(),
            what: format!("{dir} it: {what}"),
            report: None,
        };
        // The kernels waiting on this connection would otherwise wait for their timeout. The
        // abort word first: whoever sees the failure then also sees the kernels told.
        let _ = self.abort.store_u32(0, 1);
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::Proxy;
    use crate::transport::net::socket::{SocketConfig, SocketNet};
    use crate::transport::net::{Net, NetSetup};
    use crate::transport::{ConnLayout, ConnMem, Side, Transport};
    use rsccl_device::prims::conn::{ConnInfo, NCCL_STEPS};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn word(p: rsccl_device::DevPtr) -> &'static AtomicU64 {
        // SAFETY: a word of a live connection (the test keeps the ConnMem until the end).
        unsafe { &*(p.0 as *const AtomicU64) }
    }

    /// The slices a kernel would move: (alignment unit, steps per slice, bytes) per slice,
    /// including the step skips of launches that align their first step.
    fn schedule(step_bytes: u64) -> Vec<(u64, u64, u64)> {
        let mut v = Vec::new();
        for k in 0..400u64 {
            let (unit, sps) = match k % 7 {
                0..=2 => (4, 2),
                3 | 4 => (1, 1),
                5 => (2, 2),
                _ => (4, 1),
            };
            let bytes = match k % 5 {
                0 => 0,
                1 => sps * step_bytes,
                _ => (k * 977) % (sps * step_bytes) + 1,
            };
            v.push((unit, sps, bytes));
        }
        v
    }

    fn fill(k: usize, i: usize) -> u8 {
        (k * 131 + i * 7) as u8
    }

    fn wait(deadline: Instant, mut f: impl FnMut() -> bool) {
        while !f() {
            assert!(Instant::now() < deadline, "the proxy stalled");
            std::thread::yield_now();
        }
    }

    /// One connection of `layout` over `net` between two proxies on loopback: the receiving
    /// side (rank 0, `rx_peer`'s host "sender-host") and the sending side (rank `rx_peer`).
    struct Pair {
        rx_mem: ConnMem,
        tx_mem: ConnMem,
        rx_proxy: Proxy,
        tx_proxy: Proxy,
    }

    fn pair(layout: ConnLayout, net: Arc<dyn Net>, deadline: Instant) -> Pair {
        let be = crate::backend::cpu();
        let (rx_setup, tx_setup) = (
            NetSetup::new(net.clone(), be.clone(), deadline.into(), (0, 1)),
            NetSetup::new(net, be.clone(), deadline.into(), (0, 1)),
        );
        let (rx_mem, handle) = rx_setup.to_peer(1, "sender-host", (0, None)).listen(layout, 0).unwrap();
        let tx_mem = tx_setup.to_peer(0, "receiver-host", (0, None)).connect(layout, &handle).unwrap();
        let rx_proxy = rx_setup.start(0, Arc::new(be.alloc_mapped(4).unwrap())).unwrap();
        let tx_proxy = tx_setup.start(1, Arc::new(be.alloc_mapped(4).unwrap())).unwrap();
        Pair { rx_mem, tx_mem, rx_proxy, tx_proxy }
    }

    impl Pair {
        /// Both proxies ran without a failure; the memories go after them.
        fn finish(self) {
            assert!(self.rx_proxy.failure().is_none() && self.tx_proxy.failure().is_none());
            drop((self.rx_proxy, self.tx_proxy));
            drop((self.rx_mem, self.tx_mem));
        }
    }

    /// Stores `bytes` as the size of step `s` in `c`'s sizes FIFO.
    fn announce(c: &ConnInfo, s: u64, bytes: u64) {
        // SAFETY: the sizes FIFO has NCCL_STEPS words inside the live connection.
        unsafe {
            (*(c.sizes_fifo.0 as *const AtomicU64).add((s % NCCL_STEPS) as usize))
                .store(bytes, Ordering::Release)
        };
    }

    /// Two emulated kernels (a sender and a receiver thread) and two proxies over loopback TCP:
    /// every slice arrives whole, in its slot, across skipped steps and FIFO wrap-arounds.
    #[test]
    fn slices_cross_the_network_through_the_proxies() {
        let layout = ConnLayout::simple(1024);
        let deadline = Instant::now() + Duration::from_secs(60);
        let net: Arc<dyn Net> = Arc::new(SocketNet::new(
            SocketConfig { nthreads: 2, nsocks_per_thread: 2, ..SocketConfig::loopback() },
            [9; 16],
        ));
        let pair = pair(layout, net, deadline);
        let (tx, rx): (ConnInfo, ConnInfo) =
            (layout.view(pair.tx_mem.base(), Side::Send, 0), layout.view(pair.rx_mem.base(), Side::Recv, 1));
        let sched = schedule(layout.step_bytes);
        let sender = {
            let sched = sched.clone();
            std::thread::spawn(move || {
                let mut step = 0u64;
                for (k, &(unit, sps, bytes)) in sched.iter().enumerate() {
                    step = step.div_ceil(unit) * unit;
                    wait(deadline, || word(tx.head).load(Ordering::Acquire) + NCCL_STEPS >= step + sps);
                    let slot = (tx.buff.0 + (step % NCCL_STEPS) * tx.step_bytes) as *mut u8;
                    for i in 0..bytes as usize {
                        // SAFETY: bytes <= sps slots from an sps-aligned step: inside the FIFO.
                        unsafe { slot.add(i).write(fill(k, i)) };
                    }
                    announce(&tx, step, bytes);
                    step += sps;
                    word(tx.tail).store(step, Ordering::Release);
                }
            })
        };
        let mut step = 0u64;
        for (k, &(unit, sps, bytes)) in sched.iter().enumerate() {
            step = step.div_ceil(unit) * unit;
            wait(deadline, || word(rx.tail).load(Ordering::Acquire) >= step + sps);
            let slot = (rx.buff.0 + (step % NCCL_STEPS) * rx.step_bytes) as *const u8;
            for i in 0..bytes as usize {
                // SAFETY: as above, on the receiving side.
                assert_eq!(unsafe { slot.add(i).read() }, fill(k, i), "slice {k} byte {i}");
            }
            step += sps;
            word(rx.head).store(step, Ordering::Release);
        }
        sender.join().unwrap();
        pair.finish();
    }

    /// An LL region across the network: a step goes only once every line carries its flag (a
    /// line written late holds it back), and arrives whole, flags and data, in its slot —
    /// empty steps and whole-slot steps included, across FIFO wrap-arounds.
    #[test]
    fn ll_steps_cross_once_every_line_carries_its_flag() {
        use rsccl_device::prims::ll::{ll_flag, LlLine, LL_LINE_BYTES};
        let layout = ConnLayout { step_bytes: 256, ll_step_bytes: 512, ll128_step_bytes: 0 };
        let deadline = Instant::now() + Duration::from_secs(60);
        let pair = pair(layout, Arc::new(SocketNet::new(SocketConfig::loopback(), [4; 16])), deadline);
        let tx = layout.view_ll(pair.tx_mem.base(), Side::Send, 0).unwrap();
        let rx = layout.view_ll(pair.rx_mem.base(), Side::Recv, 1).unwrap();
        let slot_lines = layout.ll_step_bytes / LL_LINE_BYTES;
        let lines_of = move |s: u64| if s % 5 == 3 { 0 } else { (s * 7) % slot_lines + 1 };
        let data = |s: u64, l: u64| s << 32 | l;
        const STEPS: u64 = 60;
        let line_at =
            |c: &ConnInfo, s: u64, l: u64| c.buff.0 + (s % NCCL_STEPS) * c.step_bytes + l * LL_LINE_BYTES;
        let store = |p: u64, line: LlLine| {
            let h = line.halves();
            word(rsccl_device::DevPtr(p)).store(h[0], Ordering::Relaxed);
            word(rsccl_device::DevPtr(p + 8)).store(h[1], Ordering::Relaxed);
        };
        let sender = std::thread::spawn(move || {
            for s in 0..STEPS {
                wait(deadline, || word(tx.head).load(Ordering::Acquire) + NCCL_STEPS > s);
                let n = lines_of(s);
                announce(&tx, s, n * LL_LINE_BYTES);
                for l in (0..n).rev().skip(1) {
                    store(line_at(&tx, s, l), LlLine::new(data(s, l), ll_flag(s)));
                }
                if n > 0 && s % 4 == 1 {
                    // The last line is late: the receiver must not have the step yet.
                    std::thread::sleep(Duration::from_millis(20));
                }
                if n > 0 {
                    store(line_at(&tx, s, n - 1), LlLine::new(data(s, n - 1), ll_flag(s)));
                }
                word(tx.tail).store(s + 1, Ordering::Release);
            }
        });
        for s in 0..STEPS {
            let n = lines_of(s);
            if n == 0 {
                wait(deadline, || word(rx.tail).load(Ordering::Acquire) > s);
            }
            for l in 0..n {
                let p = line_at(&rx, s, l);
                let seen = || {
                    let h = [
                        word(rsccl_device::DevPtr(p)).load(Ordering::Acquire),
                        word(rsccl_device::DevPtr(p + 8)).load(Ordering::Acquire),
                    ];
                    LlLine::from_halves(h)
                };
                // A step sent before its late line had its flag would never show that line.
                wait(deadline, || seen().data(ll_flag(s)).is_some());
                assert_eq!(seen().data(ll_flag(s)), Some(data(s, l)), "step {s} line {l}");
            }
            word(rx.head).store(s + 1, Ordering::Release);
        }
        sender.join().unwrap();
        pair.finish();
    }

    /// An LL128 region across the network: a step goes only once the kernel's tail has passed
    /// it (a tail stored late holds it back, though every flag is there) and every line's flag
    /// word is the step's (a line seen after the tail holds it back), and arrives whole in its slot,
    /// each line's data seen once its flag is — empty steps and whole slots included, across
    /// FIFO wrap-arounds.
    #[test]
    fn ll128_steps_cross_once_the_tail_and_every_flag_are_there() {
        use rsccl_device::prims::ll128::{ll128_flag, LL128_DATA_ELEMS, LL128_LINE_BYTES, LL128_LINE_ELEMS};
        let layout = ConnLayout { step_bytes: 256, ll_step_bytes: 0, ll128_step_bytes: 8 * LL128_LINE_BYTES };
        let deadline = Instant::now() + Duration::from_secs(60);
        let pair = pair(layout, Arc::new(SocketNet::new(SocketConfig::loopback(), [6; 16])), deadline);
        let tx = layout.view_ll128(pair.tx_mem.base(), Side::Send, 0).unwrap();
        let rx = layout.view_ll128(pair.rx_mem.base(), Side::Recv, 1).unwrap();
        let slot_lines = layout.ll128_step_bytes / LL128_LINE_BYTES;
        let lines_of = move |s: u64| if s % 5 == 3 { 0 } else { (s * 7) % slot_lines + 1 };
        let data = |s: u64, l: u64, i: u64| s << 32 | l << 8 | i;
        const STEPS: u64 = 60;
        let word_at = |c: &ConnInfo, s: u64, l: u64, i: u64| {
            word(rsccl_device::DevPtr(
                c.buff.0 + (s % NCCL_STEPS) * c.step_bytes + l * LL128_LINE_BYTES + 8 * i,
            ))
        };
        // Steps the sender has published its tail for (set just before the tail).
        let published = Arc::new(AtomicU64::new(0));
        let sender = {
            let published = published.clone();
            std::thread::spawn(move || {
                let line = |s: u64, l: u64| {
                    for i in 0..LL128_DATA_ELEMS {
                        word_at(&tx, s, l, i).store(data(s, l, i), Ordering::Relaxed);
                    }
                    word_at(&tx, s, l, LL128_DATA_ELEMS).store(ll128_flag(s), Ordering::Release);
                };
                for s in 0..STEPS {
                    wait(deadline, || word(tx.head).load(Ordering::Acquire) + NCCL_STEPS > s);
                    let n = lines_of(s);
                    announce(&tx, s, n * LL128_LINE_BYTES);
                    let publish = || {
                        published.store(s + 1, Ordering::Release);
                        word(tx.tail).store(s + 1, Ordering::Release);
                    };
                    (0..n.saturating_sub(1)).for_each(|l| line(s, l));
                    if n > 0 && s % 4 == 1 {
                        // The tail shows before the last line (as host memory may show a GPU's
                        // stores after a plain fence): the receiver must not have the step yet.
                        publish();
                        std::thread::sleep(Duration::from_millis(20));
                        line(s, n - 1);
                        continue;
                    }
                    if n > 0 {
                        line(s, n - 1);
                    }
                    if s % 4 == 3 {
                        // Every flag is there, the tail is late: nor now.
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    publish();
                }
            })
        };
        for s in 0..STEPS {
            let n = lines_of(s);
            if n == 0 {
                wait(deadline, || word(rx.tail).load(Ordering::Acquire) > s);
            }
            for l in 0..n {
                // A step sent before its late line had its flag would never show that line.
                wait(deadline, || {
                    word_at(&rx, s, l, LL128_DATA_ELEMS).load(Ordering::Acquire) == ll128_flag(s)
                });
                assert!(
                    published.load(Ordering::Acquire) > s,
                    "step {s} crossed before the kernel's tail passed it"
                );
                for i in 0..LL128_DATA_ELEMS {
                    assert_eq!(
                        word_at(&rx, s, l, i).load(Ordering::Relaxed),
                        data(s, l, i),
                        "step {s} line {l} word {i}"
                    );
                }
            }
            word(rx.head).store(s + 1, Ordering::Release);
        }
        assert_eq!(LL128_LINE_ELEMS, LL128_DATA_ELEMS + 1);
        sender.join().unwrap();
        pair.finish();
    }

    /// A peer that goes away: the proxy records which peer and sets the abort word.
    #[test]
    fn a_lost_peer_is_named_and_aborts_the_kernels() {
        let be = crate::backend::cpu();
        let layout = ConnLayout::simple(256);
        let deadline = Instant::now() + Duration::from_secs(30);
        let net: Arc<dyn Net> = Arc::new(SocketNet::new(SocketConfig::loopback(), [1; 16]));
        let (rx_setup, tx_setup) = (
            NetSetup::new(net.clone(), be.clone(), deadline.into(), (0, 1)),
            NetSetup::new(net, be.clone(), deadline.into(), (0, 1)),
        );
        let (_rx_mem, handle) = rx_setup.to_peer(5, "far-host", (0, None)).listen(layout, 0).unwrap();
        let _tx_mem = tx_setup.to_peer(2, "near-host", (0, None)).connect(layout, &handle).unwrap();
        let abort = Arc::new(be.alloc_mapped(4).unwrap());
        let rx_proxy = rx_setup.start(2, abort.clone()).unwrap();
        let tx_proxy = tx_setup.start(5, Arc::new(be.alloc_mapped(4).unwrap())).unwrap();
        // The sending process is gone without a goodbye (as if killed): its sockets close.
        tx_proxy.shutdown();
        drop(tx_proxy);
        wait(deadline, || rx_proxy.failure().is_some());
        let e = rx_proxy.failure().unwrap().to_string();
        assert!(e.contains("rank 2") && e.contains("rank 5 on far-host") && e.contains("closed"), "{e}");
        // SAFETY: the abort word is a live u32 of the mapping.
        assert_eq!(unsafe { (abort.host_ptr() as *const u32).read_volatile() }, 1);
    }
}
