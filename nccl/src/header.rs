//! `nccl.h` for this library, rendered from [`abi`](crate::abi) and the exported functions'
//! own signatures ([`PROTOTYPES`](crate::PROTOTYPES)): enum values, the config struct and every
//! prototype come from the Rust definitions, so the header cannot drift from the library.
use crate::abi;
use std::fmt::Write;

/// The header's text.
///
/// ```
/// let h = nccl::header::render();
/// assert!(h.contains("#define NCCL_VERSION_CODE 22800"));
/// assert!(h.contains("ncclResult_t  ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);"));
/// ```
pub fn render() -> String {
    let mut h = String::new();
    let w = &mut h;
    w.push_str(
        "/* nccl.h for rsccl's libnccl.so.2, generated from its Rust definitions (nccl/src/abi.rs,\n \
         * nccl/src/lib.rs) by `cargo xtask nccl`: do not edit. */\n#ifndef NCCL_H_\n#define NCCL_H_\n\n\
         #include <limits.h>\n#include <stddef.h>\n#include <stdint.h>\n\n",
    );
    let _ = writeln!(w, "#define NCCL_MAJOR {}", abi::NCCL_MAJOR);
    let _ = writeln!(w, "#define NCCL_MINOR {}", abi::NCCL_MINOR);
    let _ = writeln!(w, "#define NCCL_PATCH {}", abi::NCCL_PATCH);
    let _ = writeln!(w, "#define NCCL_SUFFIX \"rsccl\"");
    let _ = writeln!(w, "#define NCCL_VERSION_CODE {}", abi::NCCL_VERSION_CODE);
    w.push_str(
        "#define NCCL_VERSION(X,Y,Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))\n\n\
         #ifdef __cplusplus\nextern \"C\" {\n#endif\n\n\
         /* The CUDA runtime's stream type (the same definition as cuda_runtime.h). */\n\
         typedef struct CUstream_st* cudaStream_t;\n\n\
         typedef struct ncclComm* ncclComm_t;\n#define NCCL_COMM_NULL NULL\n\n\
         /* Windows, and the device communicator (declared; rsccl refuses its calls). */\n\
         typedef struct ncclWindow_vidmem* ncclWindow_t;\n\
         typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;\n\
         typedef struct ncclDevComm ncclDevComm_t;\n\n",
    );
    let _ = writeln!(w, "#define NCCL_UNIQUE_ID_BYTES {}", abi::UNIQUE_ID_BYTES);
    w.push_str("typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;\n\n");
    let results: Vec<(&str, i32)> = abi::RESULTS.iter().enumerate().map(|(i, n)| (*n, i as i32)).collect();
    enumeration(w, "ncclResult_t", &results, Some(("ncclNumResults", abi::RESULTS.len() as i32)));
    let _ = writeln!(w, "#define NCCL_CONFIG_UNDEF_INT INT_MIN\n#define NCCL_CONFIG_UNDEF_PTR NULL");
    let _ = writeln!(w, "#define NCCL_SPLIT_NOCOLOR {}", abi::SPLIT_NOCOLOR);
    let _ = writeln!(w, "#define NCCL_SHRINK_DEFAULT {:#04x}", abi::SHRINK_DEFAULT);
    let _ = writeln!(w, "#define NCCL_SHRINK_ABORT {:#04x}", abi::SHRINK_ABORT);
    let _ = writeln!(w, "#define NCCL_WIN_DEFAULT {:#04x}", abi::WIN_DEFAULT);
    let _ = writeln!(w, "#define NCCL_WIN_COLL_SYMMETRIC {:#04x}", abi::WIN_COLL_SYMMETRIC);
    let _ = writeln!(w, "#define NCCL_API_MAGIC {:#x}\n", abi::API_MAGIC);
    w.push_str("typedef struct ncclConfig_v22800 {\n");
    for f in abi::CONFIG_FIELDS {
        let _ = writeln!(w, "  {f};");
    }
    w.push_str("} ncclConfig_t;\n\n#define NCCL_CONFIG_INITIALIZER { \\\n  sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE");
    for f in &abi::CONFIG_FIELDS[3..] {
        w.push_str(if f.contains('*') { ", NCCL_CONFIG_UNDEF_PTR" } else { ", NCCL_CONFIG_UNDEF_INT" });
    }
    w.push_str(" \\\n}\n\n");
    w.push_str(
        "typedef struct ncclSimInfo_v22200 {\n  size_t size;\n  unsigned int magic;\n  unsigned int version;\n  float estimatedTime;\n} ncclSimInfo_t;\n\n",
    );
    let _ = writeln!(
        w,
        "#define NCCL_SIM_INFO_INITIALIZER {{ sizeof(ncclSimInfo_t), {:#x}u, NCCL_VERSION_CODE, -1.0f }}\n",
        crate::group::SIM_INFO_MAGIC
    );
    enumeration(w, "ncclRedOp_t", &abi::RED_OPS, None);
    enumeration(w, "ncclDataType_t", &abi::DATA_TYPES, None);
    enumeration(w, "ncclScalarResidence_t", &abi::SCALAR_RESIDENCE, None);
    for p in crate::PROTOTYPES.iter().chain(crate::OTHER_PROTOTYPES) {
        let _ = writeln!(w, "{}", p.declare(" "));
        let _ = writeln!(w, "{}", p.declare("p"));
    }
    w.push_str("\n#ifdef __cplusplus\n}\n#endif\n\n#endif /* NCCL_H_ */\n");
    h
}

/// `typedef enum { … } name;` with `extra` last.
fn enumeration(w: &mut String, name: &str, values: &[(&str, i32)], extra: Option<(&str, i32)>) {
    let _ = writeln!(w, "typedef enum {{");
    for (n, v) in values.iter().chain(extra.as_ref()) {
        let _ = writeln!(w, "  {n} = {v},");
    }
    let _ = writeln!(w, "}} {name};\n");
}
