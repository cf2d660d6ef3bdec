//! Errors of the MSCCL compiler, the IR reader and the reference executor.
//!
//! Every error carries a [`Location`] (file, line, gpu, threadblock, step — whichever are
//! known) and displays as one line a user can act on.
use super::{Rank, StepIdx, TbId};
use std::fmt;

/// Where a problem is: any subset of file, line, gpu, threadblock and step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location {
    /// The file being read or checked.
    pub file: Option<String>,
    /// 1-based line in that file.
    pub line: Option<u32>,
    /// The GPU whose program has the problem.
    pub gpu: Option<Rank>,
    /// The threadblock on that GPU.
    pub tb: Option<TbId>,
    /// The step in that threadblock.
    pub step: Option<StepIdx>,
}

impl Location {
    /// A location naming one step of one threadblock of one GPU.
    pub fn step(gpu: Rank, tb: TbId, step: StepIdx) -> Self {
        Location { gpu: Some(gpu), tb: Some(tb), step: Some(step), ..Default::default() }
    }

    /// This location with its line set.
    pub fn at_line(mut self, line: u32) -> Self {
        self.line = Some(line);
        self
    }

    /// This location with its file set (kept if already set).
    pub fn in_file(mut self, file: &str) -> Self {
        if self.file.is_none() {
            self.file = Some(file.to_string());
        }
        self
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        match (&self.file, self.line) {
            (Some(file), Some(line)) => parts.push(format!("{file}:{line}")),
            (Some(file), None) => parts.push(file.clone()),
            (None, Some(line)) => parts.push(format!("line {line}")),
            (None, None) => {}
        }
        let mut what: Vec<String> = Vec::new();
        if let Some(g) = self.gpu {
            what.push(g.to_string());
        }
        if let Some(t) = self.tb {
            what.push(t.to_string());
        }
        if let Some(s) = self.step {
            what.push(s.to_string());
        }
        if !what.is_empty() {
            parts.push(what.join(" "));
        }
        if parts.is_empty() {
            write!(f, "<program>")
        } else {
            write!(f, "{}", parts.join(": "))
        }
    }
}

/// Everything that can go wrong reading, checking, compiling or running MSCCL programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MscclError {
    /// The file is not well-formed XML.
    Xml { at: Location, message: String },
    /// An element lacks an attribute the runtime requires.
    MissingAttr { at: Location, tag: String, attr: String },
    /// An attribute's value cannot be used.
    BadAttr { at: Location, tag: String, attr: String, value: String, expected: String },
    /// An element the format does not have, or one in the wrong place.
    UnexpectedElement { at: Location, tag: String, parent: String },
    /// The program breaks a structural rule of the runtime (ids, peers, counts).
    Invalid { at: Location, reason: String },
    /// A buffer offset (plus count) outside the buffer's declared chunk count.
    OutOfRange { at: Location, field: String, buf: char, off: i32, cnt: u32, limit: u32 },
    /// A `depid`/`deps` pair naming a threadblock or step that does not exist.
    MissingDep { at: Location, depid: u32, deps: u32 },
    /// A dependency on a step that does not set `hasdep`, so the runtime never signals it.
    DepWithoutHasdep { at: Location, depid: u32, deps: u32 },
    /// A receive that no send on the peer will ever satisfy.
    UnmatchedRecv { at: Location, peer: Rank, chan: u32 },
    /// A send that no receive on the peer ever consumes.
    UnmatchedSend { at: Location, peer: Rank, chan: u32 },
    /// A send and its receive disagree on the number of chunks.
    CountMismatch { at: Location, sent: u32, received: u32 },
    /// No threadblock can make progress: a dependency cycle or inconsistent send/recv order.
    Deadlock { at: Location, waiting_for: String, blocked: usize },
    /// A step reads a slot no step has written; `note` describes the in-place layout the
    /// slot was looked up in (empty out of place).
    UninitRead { at: Location, buf: char, index: u32, note: String },
    /// Two threadblocks touch the same slot and nothing orders them.
    Race { at: Location, buf: char, index: u32, other: Location },
    /// A reduction adds the same contribution twice.
    DoubleCount { at: Location, what: String },
    /// The program ends without computing its collective.
    WrongResult { at: Location, buf: char, index: u32, got: String, want: String },
    /// A DSL operation that is not valid; `op` names the operation.
    Dsl { op: String, reason: String },
    /// The compiler could not schedule the program.
    Schedule { at: Location, reason: String },
    /// A file could not be read or written.
    Io { path: String, message: String },
    /// A command line that cannot be run.
    Usage { message: String },
    /// A parameter over a limit the compiler states ([`super::limits`]), found before anything
    /// is allocated; `param` names it as on the command line, `reason` where the limit is from.
    Limit { param: String, value: u64, limit: u64, reason: String },
    /// A program over the compiler's work budget ([`super::limits::MAX_WORK`]); `what` names
    /// the algorithm and its parameters, `hint` what would fit.
    TooLarge { what: String, work: u64, limit: u64, hint: String },
}

impl MscclError {
    /// The location of the problem, if it has one.
    pub fn location(&self) -> Option<&Location> {
        use MscclError::*;
        match self {
            Xml { at, .. }
            | MissingAttr { at, .. }
            | BadAttr { at, .. }
            | UnexpectedElement { at, .. }
            | Invalid { at, .. }
            | OutOfRange { at, .. }
            | MissingDep { at, .. }
            | DepWithoutHasdep { at, .. }
            | UnmatchedRecv { at, .. }
            | UnmatchedSend { at, .. }
            | CountMismatch { at, .. }
            | Deadlock { at, .. }
            | UninitRead { at, .. }
            | Race { at, .. }
            | DoubleCount { at, .. }
            | WrongResult { at, .. }
            | Schedule { at, .. } => Some(at),
            Dsl { .. } | Io { .. } | Usage { .. } | Limit { .. } | TooLarge { .. } => None,
        }
    }

    /// The same error with its location's file (and, if unknown, line) filled in.
    pub fn in_file(mut self, file: &str, line_of: impl Fn(&Location) -> Option<u32>) -> Self {
        use MscclError::*;
        let at = match &mut self {
            Xml { at, .. }
            | MissingAttr { at, .. }
            | BadAttr { at, .. }
            | UnexpectedElement { at, .. }
            | Invalid { at, .. }
            | OutOfRange { at, .. }
            | MissingDep { at, .. }
            | DepWithoutHasdep { at, .. }
            | UnmatchedRecv { at, .. }
            | UnmatchedSend { at, .. }
            | CountMismatch { at, .. }
            | Deadlock { at, .. }
            | UninitRead { at, .. }
            | Race { at, .. }
            | DoubleCount { at, .. }
            | WrongResult { at, .. }
            | Schedule { at, .. } => at,
            Dsl { .. } | Io { .. } | Usage { .. } | Limit { .. } | TooLarge { .. } => return self,
        };
        if at.line.is_none() {
            at.line = line_of(at);
        }
        if at.file.is_none() {
            at.file = Some(file.to_string());
        }
        if let Race { other, .. } = &mut self {
            if other.line.is_none() {
                other.line = line_of(other);
            }
        }
        self
    }
}

impl fmt::Display for MscclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use MscclError::*;
        match self {
            Xml { at, message } => write!(f, "{at}: malformed XML: {message}"),
            MissingAttr { at, tag, attr } => {
                write!(f, "{at}: <{tag}> lacks required attribute `{attr}`")
            }
            BadAttr { at, tag, attr, value, expected } => {
                write!(f, "{at}: <{tag}> attribute `{attr}`=\"{value}\" is invalid; expected {expected}")
            }
            UnexpectedElement { at, tag, parent } => {
                write!(f, "{at}: unexpected <{tag}> inside <{parent}>")
            }
            Invalid { at, reason } => write!(f, "{at}: {reason}"),
            OutOfRange { at, field, buf, off, cnt, limit } => write!(
                f,
                "{at}: {field} {buf}[{off}..{}] is out of range: the buffer has {limit} chunks",
                i64::from(*off) + i64::from(*cnt)
            ),
            MissingDep { at, depid, deps } => {
                write!(f, "{at}: depends on tb {depid} step {deps}, which does not exist on this gpu")
            }
            DepWithoutHasdep { at, depid, deps } => write!(
                f,
                "{at}: depends on tb {depid} step {deps}, which has hasdep=\"0\" and so never \
                 signals; set hasdep=\"1\" there"
            ),
            UnmatchedRecv { at, peer, chan } => {
                write!(f, "{at}: receive from {peer} on channel {chan} has no matching send on that gpu")
            }
            UnmatchedSend { at, peer, chan } => {
                write!(f, "{at}: send to {peer} on channel {chan} is never received there")
            }
            CountMismatch { at, sent, received } => {
                write!(f, "{at}: receives {received} chunk(s) but the matching send carries {sent}")
            }
            Deadlock { at, waiting_for, blocked } => write!(
                f,
                "{at}: deadlock: waits for {waiting_for}, which never happens \
                 ({blocked} threadblock(s) blocked; a dependency cycle or mismatched send/recv order)"
            ),
            UninitRead { at, buf, index, note } => {
                write!(f, "{at}: reads {buf}[{index}] before anything wrote it")?;
                if !note.is_empty() {
                    write!(f, " ({note})")?;
                }
                Ok(())
            }
            Race { at, buf, index, other } => write!(
                f,
                "{at}: races with {other} on {buf}[{index}]: no dependency orders the two; add a depid/deps"
            ),
            DoubleCount { at, what } => write!(f, "{at}: reduction counts {what} twice"),
            WrongResult { at, buf, index, got, want } => {
                write!(f, "{at}: {buf}[{index}] ends as {got} but the collective needs {want}")
            }
            Dsl { op, reason } => write!(f, "invalid program: {op}: {reason}"),
            Schedule { at, reason } => write!(f, "{at}: cannot schedule: {reason}"),
            Io { path, message } => write!(f, "{path}: {message}"),
            Usage { message } => write!(f, "usage: {message}"),
            Limit { param, value, limit, reason } => {
                write!(f, "{param} = {value} is over the limit of {limit}: {reason}")
            }
            TooLarge { what, work, limit, hint } => write!(
                f,
                "{what} is {work} chunk transfers, over the compiler's limit of {limit} (MAX_WORK, which \
                 bounds compile time and memory){hint}"
            ),
        }
    }
}

impl std::error::Error for MscclError {}
