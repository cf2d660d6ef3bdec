//! The hooks the listener's reader threads call when another rank's notice arrives (a
//! departure, a refused send), shared by the [`Bootstrap`](super::Bootstrap) that installs
//! them: they run while the rank's owner may be blocked in a call.
use super::depart::{Departure, DepartureHook};
use super::refusal::{Refusal, RefusalHook};
use std::sync::RwLock;

/// The installed hooks (none until the communicator installs them: a notice is then dropped).
#[derive(Default)]
pub(crate) struct NoticeBoard {
    departed: RwLock<Option<DepartureHook>>,
    refused: RwLock<Option<RefusalHook>>,
}

impl NoticeBoard {
    pub fn on_departure(&self, hook: DepartureHook) {
        *self.departed.write().unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    pub fn on_refusal(&self, hook: RefusalHook) {
        *self.refused.write().unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    pub fn departed(&self, d: &Departure) {
        let hook = self.departed.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(h) = hook {
            h(d);
        }
    }

    pub fn refused(&self, r: &Refusal) {
        let hook = self.refused.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(h) = hook {
            h(r);
        }
    }
}
