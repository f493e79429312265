//! Module images as the simulated driver reads them: PTX text, whose `.entry` names say
//! which kernels a module has, or binary code (cubin, fatbin) that it cannot parse.

use std::collections::HashSet;
use std::ffi::{CStr, c_char, c_void};

use cuda_sys::CUresult;

/// What a module or library image declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Image {
    /// PTX text: the kernels it declares with `.entry`.
    Ptx(HashSet<String>),
    /// A cubin or fatbin: unparsed, so every bound kernel is taken to be in it.
    Binary,
}

impl Image {
    /// Whether a kernel of this name may be found in the image (it must also be bound).
    pub(crate) fn declares(&self, name: &str) -> bool {
        match self {
            Image::Ptx(entries) => entries.contains(name),
            Image::Binary => true,
        }
    }
}

/// Why the kernel `name` is not found in `image` (`bound`: whether a host twin of that
/// name is bound), for the message of its `CUDA_ERROR_NOT_FOUND`.
pub(crate) fn missing_kernel(image: &Image, bound: bool, name: &str) -> String {
    if image.declares(name) && !bound {
        return format!(
            "kernel {name:?} is in the image but no host twin is bound for it; bind one with \
             MockDriver::kernel({name:?}, &[parameter sizes], |call| ...) before the build, or \
             MockWorld::bind_kernel after it (a program on the drop-in library: \
             simgpu_bind_kernel)"
        );
    }
    match image {
        Image::Ptx(entries) => {
            let mut names: Vec<&str> = entries.iter().map(String::as_str).collect();
            names.sort_unstable();
            format!(
                "the image declares no kernel {name:?} (its .entry kernels: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )
        }
        Image::Binary => format!("no kernel {name:?} in the image"),
    }
}

/// The magic numbers binary images start with: ELF (cubin), fatbin, and the fatbin
/// wrapper that `nvcc` embeds in host code.
const MAGICS: [[u8; 4]; 3] = [
    [0x7f, b'E', b'L', b'F'],
    0xBA55_ED50u32.to_le_bytes(),
    0x4662_43B1u32.to_le_bytes(),
];

/// Reads an image the way the driver does: binary code is recognised by its first four
/// bytes; anything else is NUL-terminated text, which must be PTX (it has `.version` or
/// `.entry`), else `CUDA_ERROR_INVALID_IMAGE`.
///
/// # Safety
/// `image` is non-null and points at a valid image: binary code (at least four bytes) or
/// a NUL-terminated string. Bytes are read one at a time and reading stops at a NUL, so
/// a short string is never read past its end.
pub(crate) unsafe fn read(image: *const c_void) -> Result<Image, CUresult> {
    let bytes = image.cast::<u8>();
    let mut head = [0u8; 4];
    for (i, slot) in head.iter_mut().enumerate() {
        // SAFETY: the bytes before `i` are non-NUL, so byte `i` is still inside the image
        // (a string's terminator has not been passed; binary images hold four bytes).
        let b = unsafe { *bytes.add(i) };
        if b == 0 {
            break;
        }
        *slot = b;
    }
    if MAGICS.contains(&head) {
        return Ok(Image::Binary);
    }
    // SAFETY: not binary, so by the caller's contract a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_string_lossy();
    let text = strip_comments(&text);
    if !text.contains(".version") && !text.contains(".entry") {
        return Err(CUresult::CUDA_ERROR_INVALID_IMAGE);
    }
    Ok(Image::Ptx(entries(&text)))
}

/// The names declared with `.entry` (kernels), e.g. `saxpy` in
/// `.visible .entry saxpy(.param .u64 x)`.
fn entries(ptx: &str) -> HashSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.' | '%');
    let tokens: Vec<&str> = ptx
        .split(|c: char| c.is_whitespace() || matches!(c, '(' | ')' | '{' | ',' | ';'))
        .filter(|t| !t.is_empty())
        .collect();
    tokens
        .windows(2)
        .filter(|w| w[0] == ".entry")
        .map(|w| w[1].chars().take_while(|c| ident(*c)).collect::<String>())
        .filter(|n| !n.is_empty())
        .collect()
}

/// PTX without its `//` and `/* */` comments (so a commented-out entry is not one).
fn strip_comments(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    let mut rest = ptx;
    while !rest.is_empty() {
        let line = rest.find("//");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find('\n').map_or("", |e| &rest[l + e..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                out.push(' ');
                rest = rest[b + 2..]
                    .find("*/")
                    .map_or("", |e| &rest[b + 2 + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                rest = "";
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_str(s: &CStr) -> Result<Image, CUresult> {
        // SAFETY: a NUL-terminated string.
        unsafe { read(s.as_ptr().cast()) }
    }

    #[test]
    fn ptx_entries_are_the_kernels() {
        let ptx = c".version 8.0\n.target sm_90\n// .entry commented(\n/* .entry hidden( */\n\
            .visible .entry saxpy(\n .param .u64 x\n)\n{ ret; }\n.entry _Z4tinyv()\n{ ret; }\n";
        let Ok(Image::Ptx(names)) = read_str(ptx) else {
            unreachable!("PTX expected")
        };
        let mut names: Vec<_> = names.into_iter().collect();
        names.sort();
        assert_eq!(names, ["_Z4tinyv", "saxpy"]);
    }

    #[test]
    fn comments_end_where_they_end() {
        // A block comment first on the line, with `//` inside it, ending right before an
        // entry; then a line comment holding `/*`.
        let ptx = c"/* a // b */.entry k1(\n.entry k2( // x /* y\n.entry k3(\n";
        let Ok(Image::Ptx(names)) = read_str(ptx) else {
            unreachable!("PTX expected")
        };
        let mut names: Vec<_> = names.into_iter().collect();
        names.sort();
        assert_eq!(names, ["k1", "k2", "k3"]);
        assert_eq!(strip_comments("x/**/y // z\nw /* u */ v"), "x y \nw   v");
    }

    #[test]
    fn binary_images_and_short_or_foreign_text() {
        let elf = [0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        // SAFETY: eight readable bytes.
        assert_eq!(unsafe { read(elf.as_ptr().cast()) }, Ok(Image::Binary));
        let fatbin = 0xBA55_ED50u32.to_le_bytes();
        // SAFETY: four readable bytes.
        assert_eq!(unsafe { read(fatbin.as_ptr().cast()) }, Ok(Image::Binary));
        assert_eq!(read_str(c""), Err(CUresult::CUDA_ERROR_INVALID_IMAGE));
        assert_eq!(read_str(c"hello"), Err(CUresult::CUDA_ERROR_INVALID_IMAGE));
        assert_eq!(read_str(c".version 8.0"), Ok(Image::Ptx(HashSet::new())));
    }
}
