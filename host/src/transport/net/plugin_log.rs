//! The logger a hosted NCCL net plugin is given (`ncclDebugLogger_t`: `void (int level,
//! unsigned long flags, const char* file, int line, const char* fmt, ...)`): its lines go to
//! rsccl's log at rsccl's levels (NCCL: 2 warn, 3 info, 5 trace), the format's arguments
//! expanded as `printf` would — integers, characters, strings and pointers; a floating-point
//! argument (passed in a vector register, which stable Rust cannot read) prints as `?`.
//!
//! Stable Rust cannot define a C-variadic function, so the logger is a plain function with
//! [`LOG_ARGS`] integer parameters after the five named ones: on the System V x86-64 and
//! AAPCS64 (Linux) conventions a variadic call places its integer-class arguments exactly where
//! a call passing them as ordinary parameters would (x86-64: `r9`, then the stack; AArch64:
//! `x5`–`x7`, then the stack), and the caller cleans up. Parameters past those the plugin passed
//! hold whatever is in those registers and stack slots; the format says how many were passed,
//! and no others are read as values.
use super::plugin_abi as abi;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_ulong};

/// Integer-class variadic arguments a log line may use; a format wanting more prints the rest
/// of itself unexpanded.
pub const LOG_ARGS: usize = 8;
/// Most bytes of one `%s` argument read (a string without its NUL within this is cut).
pub const MAX_LOG_STRING: usize = 4096;

thread_local! {
    /// The last warning a plugin logged on this thread, for the error of the call that failed.
    static LAST_WARNING: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Takes the last warning a plugin logged on this thread since the last call.
pub fn last_warning() -> Option<String> {
    LAST_WARNING.with(|w| w.borrow_mut().take())
}

/// Reads a NUL-terminated string of at most [`MAX_LOG_STRING`] bytes.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string, or to [`MAX_LOG_STRING`] readable bytes.
unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return "(null)".to_string();
    }
    let mut bytes = Vec::new();
    while bytes.len() < MAX_LOG_STRING {
        // SAFETY: within the string or its NUL (the caller's contract).
        let b = unsafe { *p.add(bytes.len()) } as u8;
        if b == 0 {
            break;
        }
        bytes.push(b);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `fmt` with its conversions filled from `args`, the integer-class arguments in order, as
/// `printf` does: `%d %i %u %x %X %o %c %s %p %%` with flags (`-0+ #`), width, precision (`*`
/// takes an argument) and length modifiers (`hh h l ll z j t`); `%f %e %g %a` print `?` and take
/// no integer argument; `%n` takes one and writes nothing. Once `args` run out, the rest of the
/// format is copied as it is.
///
/// # Safety
/// Each `%s` argument is NULL or a string as [`c_string`] needs.
pub unsafe fn expand(fmt: &[u8], args: &[usize]) -> String {
    let mut out = String::new();
    let mut next = args.iter().copied();
    let mut i = 0;
    while i < fmt.len() {
        if fmt[i] != b'%' {
            let end = fmt[i..].iter().position(|&b| b == b'%').map_or(fmt.len(), |k| i + k);
            out.push_str(&String::from_utf8_lossy(&fmt[i..end]));
            i = end;
            continue;
        }
        let start = i;
        i += 1;
        let (mut left, mut zero, mut plus, mut space, mut alt) = (false, false, false, false, false);
        while let Some(&f) = fmt.get(i) {
            match f {
                b'-' => left = true,
                b'0' => zero = true,
                b'+' => plus = true,
                b' ' => space = true,
                b'#' => alt = true,
                _ => break,
            }
            i += 1;
        }
        // Width and precision: digits, or `*` taking an int argument.
        let number = |i: &mut usize, next: &mut dyn Iterator<Item = usize>| -> Option<Option<usize>> {
            if fmt.get(*i) == Some(&b'*') {
                *i += 1;
                return Some(Some((next.next()? as u32 as i32).max(0) as usize));
            }
            let s = *i;
            while fmt.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            Some(std::str::from_utf8(&fmt[s..*i]).ok().and_then(|d| d.parse().ok()))
        };
        let Some(width) = number(&mut i, &mut next) else {
            out.push_str(&String::from_utf8_lossy(&fmt[start..]));
            return out;
        };
        let mut precision = None;
        if fmt.get(i) == Some(&b'.') {
            i += 1;
            match number(&mut i, &mut next) {
                Some(p) => precision = Some(p.unwrap_or(0)),
                None => {
                    out.push_str(&String::from_utf8_lossy(&fmt[start..]));
                    return out;
                }
            }
        }
        let mut wide = false;
        while let Some(&m) = fmt.get(i) {
            match m {
                b'l' | b'z' | b'j' | b't' | b'L' | b'q' => wide = true,
                b'h' => {}
                _ => break,
            }
            i += 1;
        }
        let Some(&conv) = fmt.get(i) else {
            out.push_str(&String::from_utf8_lossy(&fmt[start..]));
            return out;
        };
        i += 1;
        if conv == b'%' {
            out.push('%');
            continue;
        }
        if matches!(conv, b'f' | b'F' | b'e' | b'E' | b'g' | b'G' | b'a' | b'A') {
            out.push('?');
            continue;
        }
        let Some(arg) = next.next() else {
            out.push_str(&String::from_utf8_lossy(&fmt[start..]));
            return out;
        };
        let (mut body, numeric) = match conv {
            b'd' | b'i' => {
                let v = if wide { arg as i64 } else { arg as u32 as i32 as i64 };
                let sign = if v < 0 {
                    "-"
                } else if plus {
                    "+"
                } else if space {
                    " "
                } else {
                    ""
                };
                (format!("{sign}{}", v.unsigned_abs()), true)
            }
            b'u' | b'x' | b'X' | b'o' => {
                let v = if wide { arg as u64 } else { arg as u32 as u64 };
                let s = match conv {
                    b'u' => v.to_string(),
                    b'x' => format!("{}{v:x}", if alt && v != 0 { "0x" } else { "" }),
                    b'X' => format!("{}{v:X}", if alt && v != 0 { "0X" } else { "" }),
                    _ => format!("{}{v:o}", if alt { "0" } else { "" }),
                };
                (s, true)
            }
            b'c' => ((arg as u8 as char).to_string(), false),
            b'p' => (format!("{arg:#x}"), false),
            // SAFETY: the plugin's string argument (the caller's contract).
            b's' => (unsafe { c_string(arg as *const c_char) }, false),
            b'n' => continue,
            _ => {
                // Not a conversion printf knows: copy it as it is (the argument is not used).
                out.push_str(&String::from_utf8_lossy(&fmt[start..i]));
                continue;
            }
        };
        if conv == b's' {
            if let Some(p) = precision {
                body = body.chars().take(p).collect();
            }
        }
        let pad = width.unwrap_or(0).saturating_sub(body.chars().count());
        if left {
            out.push_str(&body);
            out.extend(std::iter::repeat_n(' ', pad));
        } else if zero && numeric && precision.is_none() {
            let sign = body.starts_with(['-', '+', ' ']).then(|| body.remove(0));
            out.extend(sign);
            out.extend(std::iter::repeat_n('0', pad));
            out.push_str(&body);
        } else {
            out.extend(std::iter::repeat_n(' ', pad));
            out.push_str(&body);
        }
    }
    out
}

/// The logger (see the module's notes): one line to rsccl's log at the plugin's level.
#[allow(clippy::too_many_arguments)] // The named parameters and LOG_ARGS variadic ones.
unsafe extern "C" fn log_line(
    level: c_int,
    _flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    a0: usize,
    a1: usize,
    a2: usize,
    a3: usize,
    a4: usize,
    a5: usize,
    a6: usize,
    a7: usize,
) {
    let args: [usize; LOG_ARGS] = [a0, a1, a2, a3, a4, a5, a6, a7];
    // SAFETY: the plugin passes its file name and format as NUL-terminated strings, and the
    // format's arguments after them (the module's notes).
    let (file, text) = unsafe {
        let f = if file.is_null() { String::new() } else { c_string(file) };
        let t = if fmt.is_null() { String::new() } else { expand(c_string(fmt).as_bytes(), &args) };
        (f, text_only(t))
    };
    match level {
        2 | 4 => {
            tracing::warn!("NET/Plugin {file}:{line}: {text}");
            LAST_WARNING.with(|w| *w.borrow_mut() = Some(text));
        }
        3 => tracing::info!("NET/Plugin {file}:{line}: {text}"),
        _ => tracing::trace!("NET/Plugin {file}:{line}: {text}"),
    }
}

/// A log line without its trailing newline (NCCL's own logger adds one).
fn text_only(mut t: String) -> String {
    while t.ends_with(['\n', '\r']) {
        t.pop();
    }
    t
}

/// [`log_line`] as the variadic logger type plugins call.
pub fn logger() -> Result<abi::Logger> {
    if cfg!(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))) {
        return Err(Error::Network(
            "hosting NCCL net plugins needs Linux on x86-64 or aarch64 (their logger's C varargs)".into(),
        ));
    }
    type Fixed = unsafe extern "C" fn(
        c_int,
        c_ulong,
        *const c_char,
        c_int,
        *const c_char,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
    );
    let f: Fixed = log_line;
    // SAFETY: on the System V x86-64 and AAPCS64 (Linux) conventions a variadic call passes its
    // named arguments, and then its integer-class variadic ones, where a call of `Fixed` passes
    // its parameters, and the caller cleans up; the parameters the plugin did not pass are read
    // from registers and the caller's stack (mapped) but never used as values (the module's
    // notes).
    Ok(unsafe { std::mem::transmute::<Fixed, abi::Logger>(f) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    #[test]
    fn printf_conversions_expand_from_the_integer_arguments() {
        let s = CString::new("mlx5_0").unwrap();
        let p = s.as_ptr() as usize;
        let neg = (-42i32) as u32 as usize;
        // SAFETY: the one %s argument is a live C string.
        let got = unsafe {
            expand(
                b"NET/IB : %s:%d %5d|%-4d|%04d %lu %x %#X %c %.3s %% %f %p %zu end",
                &[p, 1, 7, 3, neg, 12_345_678_901, 255, 255, b'Q' as usize, p, 0x1000, 9],
            )
        };
        assert_eq!(got, "NET/IB : mlx5_0:1     7|3   |-042 12345678901 ff 0XFF Q mlx % ? 0x1000 9 end");
    }

    #[test]
    fn a_format_wanting_more_arguments_prints_the_rest_as_it_is() {
        // SAFETY: no %s is expanded.
        let got = unsafe { expand(b"%d and %d and %d", &[1, 2]) };
        assert_eq!(got, "1 and 2 and %d");
        // SAFETY: as above.
        assert_eq!(unsafe { expand(b"%s", &[0]) }, "(null)");
        // SAFETY: as above.
        assert_eq!(unsafe { expand(b"50%", &[]) }, "50%");
    }
}
