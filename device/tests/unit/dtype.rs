//! `rsccl_device::dtype`'s tests (run as an integration test: see `main.rs`).
use rsccl_device::dtype::*;

#[test]
fn repr_matches_nccl_numbering_and_round_trips() {
    for (i, t) in DataType::ALL.iter().enumerate() {
        assert_eq!(*t as u8 as usize, i);
        assert_eq!(DataType::from_u8(i as u8), Ok(*t));
    }
    assert_eq!(DataType::from_u8(200), Err(UnknownDataType(200)));
}

#[test]
fn only_fp8_requires_sm90() {
    let fp8: Vec<_> = DataType::ALL.iter().filter(|t| t.requires_sm90()).collect();
    assert_eq!(fp8, [&DataType::Fp8E4M3, &DataType::Fp8E5M2]);
}
