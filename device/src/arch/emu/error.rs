//! How an emulated launch fails: below every other file of the emulator, which all report
//! with it.

/// Why an emulated launch failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmuError {
    /// The launch shape is not one a GPU accepts.
    InvalidLaunch(String),
    /// A thread trapped or panicked; the first such thread and its message.
    Trapped {
        /// Block index (x) of the thread.
        block: u32,
        /// Thread index (x) within the block.
        thread: u32,
        /// What it reported.
        message: String,
    },
    /// The OS refused to start another thread.
    Spawn(String),
}

impl std::fmt::Display for EmuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmuError::InvalidLaunch(m) => write!(f, "invalid launch: {m}"),
            EmuError::Trapped { block, thread, message } => {
                write!(f, "kernel trapped in block {block} thread {thread}: {message}")
            }
            EmuError::Spawn(m) => write!(f, "could not start emulated thread: {m}"),
        }
    }
}
impl std::error::Error for EmuError {}
