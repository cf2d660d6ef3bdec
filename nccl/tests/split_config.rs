//! The configuration of communicators made through the C API: a split or shrink given a NULL
//! config inherits its parent's (NCCL's `copyCommConfig`), one given a config takes it, and
//! `ncclCommInitAll`'s communicators get the C API's defaults as every other init does.
use nccl::abi::{NcclComm, NcclConfig, NcclUniqueId, SUCCESS};
use nccl::{
    handle, ncclCommDestroy, ncclCommInitAll, ncclCommInitRankConfig, ncclCommShrink, ncclCommSplit,
    ncclGetUniqueId, C_API_TIMEOUT,
};
use rsccl::CommConfig;
use std::ptr::{null, null_mut};

/// The configuration communicator `c` runs with.
fn config(c: NcclComm) -> CommConfig {
    handle::handle(c).unwrap().comm().unwrap().config().clone()
}

#[test]
fn splits_without_a_config_inherit_the_parents() {
    std::env::set_var("RSCCL_BACKEND", "cpu");
    // The timeouts compared are the C API's default.
    std::env::remove_var("RSCCL_TIMEOUT");
    std::env::remove_var("NCCL_TIMEOUT");
    std::env::set_var("RSCCL_SOCKET_IFNAME", "lo");
    let mut id = NcclUniqueId { internal: [0; nccl::abi::UNIQUE_ID_BYTES] };
    // SAFETY: valid out-pointers and configs of this test throughout.
    unsafe {
        assert_eq!(ncclGetUniqueId(&mut id), SUCCESS);
        // One channel instead of the default two.
        let mut one = NcclConfig { max_ctas: 1, ..NcclConfig::default() };
        let mut parent: NcclComm = null_mut();
        assert_eq!(ncclCommInitRankConfig(&mut parent, 1, id, 0, &mut one), SUCCESS);
        assert_eq!(config(parent).nchannels, 1);
        let c_api = config(parent).timeout;
        assert_eq!(c_api, C_API_TIMEOUT);

        let mut split: NcclComm = null_mut();
        assert_eq!(ncclCommSplit(parent, 0, 0, &mut split, null_mut()), SUCCESS);
        assert_eq!(config(split).nchannels, 1, "a split without a config has the parent's");
        assert_eq!(config(split).timeout, c_api);
        let mut three = NcclConfig { min_ctas: 3, ..NcclConfig::default() };
        let mut given: NcclComm = null_mut();
        assert_eq!(ncclCommSplit(parent, 0, 0, &mut given, &mut three), SUCCESS);
        assert_eq!(config(given).nchannels, 3, "a split with a config has its own");
        // A negative color other than NCCL_SPLIT_NOCOLOR is a color, as in NCCL.
        let mut negative: NcclComm = null_mut();
        assert_eq!(ncclCommSplit(parent, -5, 0, &mut negative, null_mut()), SUCCESS);
        assert!(!negative.is_null(), "color -5 made no child");
        assert_eq!(ncclCommDestroy(negative), SUCCESS);
        let mut shrunk: NcclComm = null_mut();
        assert_eq!(ncclCommShrink(parent, null_mut(), 0, &mut shrunk, null_mut(), 0), SUCCESS);
        assert_eq!(config(shrunk).nchannels, 1, "a shrink without a config has the parent's");
        // A split of a split without a config: still the first parent's.
        let mut grand: NcclComm = null_mut();
        assert_eq!(ncclCommSplit(split, 0, 0, &mut grand, null_mut()), SUCCESS);
        assert_eq!(config(grand).nchannels, 1);
        for c in [grand, shrunk, given, split, parent] {
            assert_eq!(ncclCommDestroy(c), SUCCESS);
        }

        // ncclCommInitAll: the C API's timeouts, as every other init, not the Rust API's 30 s.
        let mut all: [NcclComm; 2] = [null_mut(); 2];
        assert_eq!(ncclCommInitAll(all.as_mut_ptr(), 2, null()), SUCCESS);
        for c in all {
            assert_eq!((config(c).timeout, config(c).bootstrap_timeout), (c_api, c_api));
        }
        for c in all {
            assert_eq!(ncclCommDestroy(c), SUCCESS);
        }
    }
}
