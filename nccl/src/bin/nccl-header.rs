//! Writes the `nccl.h` of this library to the path given (stdout without one): `cargo xtask
//! nccl` puts it beside `libnccl.so.2`.
fn main() -> std::process::ExitCode {
    let text = nccl::header::render();
    match std::env::args().nth(1) {
        None => print!("{text}"),
        Some(path) => {
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("nccl-header: writing {path}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}
