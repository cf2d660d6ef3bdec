//! The committed packs unpack to one module per entry, each form where the index says; a damaged
//! chunk is an error naming the module and the chunk file; the chunk format's reader refuses
//! what does not add up.
use super::pack::{frame, PackError, Unpacked, MAGIC};
use super::*;

#[test]
fn every_library_module_unpacks_to_its_entry_and_cubin() {
    for arch in ["sm_90", "sm_80"] {
        let pack = Pack::of(arch).expect("a pack");
        assert!(!pack.modules.is_empty(), "{arch}: no modules");
        let lib = library(arch).expect("unpacks");
        assert_eq!(lib.len(), pack.modules.len());
        for m in &lib {
            assert_eq!(entry_points(m.ptx).collect::<Vec<_>>(), [m.entry], "{arch}");
            assert!(m.cubin.is_some_and(|c| c.starts_with(b"\x7fELF")), "{arch} {}: no cubin", m.entry);
        }
        let names: Vec<&str> = lib.iter().map(|m| m.entry).collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{arch}: entries in order");
    }
    assert!(library("sm_70").expect("no arch").is_empty());
}

#[test]
fn image_takes_the_cubin_only_where_it_fits() {
    let entry = "rsccl_all_reduce_ring_f32";
    match image("sm_90", entry, true) {
        Ok(Some(Image::Cubin(bin))) => assert!(bin.starts_with(b"\x7fELF")),
        other => panic!("{other:?}"),
    }
    match image("sm_90", entry, false) {
        Ok(Some(Image::Ptx(text))) => assert!(text.contains(&format!(".entry {entry}("))),
        other => panic!("{other:?}"),
    }
    assert!(matches!(image("sm_90", "rsccl_no_such_kernel", true), Ok(None)));
}

/// A pack of one arch whose first chunk is `bytes` in place of the committed one.
fn pack_with_first_chunk(bytes: Vec<u8>) -> &'static Pack {
    let real = Pack::of("sm_90").expect("sm_90");
    let mut chunks = vec![Chunk { file: real.chunks[0].file, packed: Box::leak(bytes.into_boxed_slice()) }];
    chunks.extend(real.chunks[1..].iter().map(|c| Chunk { file: c.file, packed: c.packed }));
    Box::leak(Box::new(Pack::new("sm_90", Box::leak(chunks.into_boxed_slice()), real.modules)))
}

#[test]
fn a_damaged_chunk_is_an_error_naming_the_module_and_the_file() {
    let real = Pack::of("sm_90").expect("sm_90");
    let victim = real.modules.iter().find(|m| m.ptx == 0).expect("a module in chunk 0");
    let mut flipped = real.chunks[0].packed.to_vec();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x55;
    let truncated = real.chunks[0].packed[..real.chunks[0].packed.len() - 30].to_vec();
    for bytes in [flipped, truncated, b"not lzip".to_vec()] {
        let pack = pack_with_first_chunk(bytes);
        let err = pack.module(victim).expect_err("a damaged chunk");
        match &err {
            Error::CorruptModule { arch: "sm_90", entry, file, reason: PackError::Decompress(_) } => {
                assert_eq!((entry.as_str(), *file), (victim.entry, real.chunks[0].file));
            }
            other => panic!("{other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains(victim.entry) && text.contains(real.chunks[0].file), "{text}");
        // The same error again (the failure is kept, not retried), and other chunks still load.
        assert_eq!(pack.module(victim).expect_err("again"), err);
        let elsewhere = pack.modules.iter().find(|m| m.ptx != 0).expect("a module elsewhere");
        assert!(pack.module(elsewhere).is_ok());
    }
}

#[test]
fn the_chunk_reader_refuses_what_does_not_add_up() {
    let raw = frame(&[("k_a", b"aaa"), ("k_b", b"")]).expect("frame");
    assert_eq!(raw, format!("{MAGIC}\nk_a 3\nk_b 0\n\naaa").into_bytes());
    let chunk = Unpacked::parse(raw.clone()).expect("parse");
    assert_eq!((chunk.get("k_a"), chunk.get("k_b")), (Ok(&b"aaa"[..]), Ok(&b""[..])));
    assert_eq!(chunk.get("k_c"), Err(PackError::Missing { entry: "k_c".into() }));
    assert!(frame(&[("k a", b"x")]).is_err(), "an entry name with a space");
    let header_error = |bytes: &[u8]| matches!(Unpacked::parse(bytes.to_vec()), Err(PackError::Header(_)));
    let mut longer = raw.clone();
    longer.push(b'!');
    let (other_version, not_a_length, unended, past_the_end) = (
        "rsccl-kernel-chunk 2\n\n".to_string(),
        format!("{MAGIC}\nk_a three\n\n"),
        format!("{MAGIC}\nk_a 3\n"),
        format!("{MAGIC}\nk_a 99999999999\n\n"),
    );
    let bad: [&[u8]; 6] = [
        &raw[..raw.len() - 1], // a module cut short
        &longer,               // bytes after the last module
        other_version.as_bytes(),
        not_a_length.as_bytes(),
        unended.as_bytes(),
        past_the_end.as_bytes(),
    ];
    for bytes in bad {
        assert!(header_error(bytes), "{:?}", String::from_utf8_lossy(bytes));
    }
}
