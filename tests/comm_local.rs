//! LocalGroup: configuration errors are reported clearly, and a group is usable across calls.
use rsccl::backend;
use rsccl::comm::{GroupConfig, LocalGroup};

#[test]
fn bad_group_configurations_are_rejected_with_the_reason() {
    let be = backend::cpu();
    let cases: Vec<(GroupConfig, &str)> = vec![
        (GroupConfig::new(0, 1), "nranks must be at least 1"),
        (GroupConfig::new(2, 0), "nchannels 0 is outside 1..=64"),
        (GroupConfig { nthreads: 100, ..GroupConfig::new(2, 1) }, "nthreads 100 must be a multiple of 32"),
        (
            GroupConfig { step_bytes: 100, ..GroupConfig::new(2, 1) },
            "step_bytes 100 must be a multiple of 128",
        ),
        (
            GroupConfig { rings: Some(vec![vec![0, 0]]), ..GroupConfig::new(2, 1) },
            "is not a permutation of 0..2",
        ),
        (
            GroupConfig { rings: Some(vec![vec![0, 1]]), ..GroupConfig::new(2, 2) },
            "1 rings given for 2 channels",
        ),
    ];
    for (cfg, want) in cases {
        let err = LocalGroup::new(&be, cfg).err().expect("configuration must be rejected");
        assert!(err.to_string().contains(want), "{err} (wanted: {want})");
    }
}
