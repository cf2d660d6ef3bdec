//! [`bytemuck::Pod`] for the crate's plain-data types without the proc-macro derive (which
//! would build `syn` for every PTX compile): [`unsafe_impl_pod!`] checks at compile time what
//! the derive checks (every field named and `Pod`, no padding) and implements the traits.

/// The size of a struct's field (`field_size(|s: &S| &s.f)`), which must be [`bytemuck::Pod`].
/// Only its type is used: the accessor is never called.
pub const fn field_size<S, F: bytemuck::Pod>(_field: fn(&S) -> &F) -> usize {
    core::mem::size_of::<F>()
}

/// `unsafe_impl_pod!(T { a, b, … })` implements [`bytemuck::Zeroable`] and [`bytemuck::Pod`]
/// for the `#[repr(C)]` or `#[repr(transparent)]` struct `T` (non-generic) after checking at
/// compile time that the list names every field (a pattern without `..`), that every field is
/// `Pod`, and that the fields' sizes add up to `T`'s size (no padding). Tuple structs list
/// `0`, `1`, ….
macro_rules! unsafe_impl_pod {
    ($t:ident { $($f:tt),+ $(,)? }) => {
        const _: () = {
            // Fails to compile if a field is missing from the list.
            #[allow(dead_code)]
            fn every_field_listed(v: $t) {
                let $t { $($f: _),+ } = v;
            }
            assert!(
                core::mem::size_of::<$t>() == 0 $(+ $crate::pod::field_size(|s: &$t| &s.$f))+,
                concat!(stringify!($t), " has padding")
            );
        };
        // SAFETY: `$t` is `#[repr(C)]`/`#[repr(transparent)]` (the caller's promise), every
        // field is `Pod` and the fields fill its size (both checked above), so any bit pattern,
        // all zeros included, is a valid `$t` and it has no uninitialised bytes.
        unsafe impl bytemuck::Zeroable for $t {}
        // SAFETY: as for `Zeroable` above; `$t` is also `Copy + 'static` (required by `Pod`).
        unsafe impl bytemuck::Pod for $t {}
    };
}
pub(crate) use unsafe_impl_pod;
