//! The extents a CUDA array may have, as cuda.h documents them for `cuArray3DCreate` and
//! `cuMipmappedArrayCreate` (the "valid extents" tables), and the device limits they are judged
//! against (`CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE*` / `MAXIMUM_SURFACE*`, which `attrs` answers
//! from here: one table for both).
//!
//! The limits are those of every profile the emulator has (compute capability 7.5 to 9.0):
//! `deviceQuery` on a Tesla T4 prints 1D=(131072), 2D=(131072, 65536), 3D=(16384, 16384, 16384),
//! layered 1D (32768) x 2048 and layered 2D (32768, 32768) x 2048; the cubemap, gather,
//! mipmapped and surface limits are the CUDA programming guide's per-compute-capability table.
//! The alternate 3D extents (`TEXTURE3D_*_ALTERNATE`) are not offered: where unsure, the
//! emulator refuses rather than allows.

use cuda_abi::CUdevice_attribute as A;
use cuda_abi::{CUresult, CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_LAYERED, CUDA_ARRAY3D_SURFACE_LDST, CUDA_ARRAY3D_TEXTURE_GATHER};

/// The array-extent limit a device attribute names, `None` for any other attribute.
pub fn limit(a: A) -> Option<i64> {
    Some(match a {
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH => 131_072,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH => 131_072,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT => 65_536,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH
        | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT
        | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH => 16_384,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS => 2048,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS => 2048,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS => 2046,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH => 131_072,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT => 65_536,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH
        | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT
        | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH => 16_384,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS => 2048,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS => 2048,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH | A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH => 32_768,
        A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS => 2046,
        _ => return None,
    })
}

fn lim(a: A) -> usize {
    // Every attribute asked for here is in the table.
    limit(a).map_or(0, |v| v as usize)
}

/// `(width, height, depth)` upper bounds, 0 = that extent must be 0.
type Bounds = (usize, usize, usize);

/// Whether an array of `(w, h, d)` extents with `flags` may be created (`mipmapped`: by
/// `cuMipmappedArrayCreate`, whose 1D and 2D limits are the mipmapped ones). `Err` is the
/// driver's `CUDA_ERROR_INVALID_VALUE`: an array type the extents do not describe (a depth
/// without a height, a cubemap that is not square or not 6 faces a layer, texture gather on
/// anything but 2D), or an extent past the device's limit (with `CUDA_ARRAY3D_SURFACE_LDST`
/// the surface limit too).
pub fn check(w: usize, h: usize, d: usize, flags: u32, mipmapped: bool) -> Result<(), CUresult> {
    let bad = Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    let layered = flags & CUDA_ARRAY3D_LAYERED != 0;
    let cubemap = flags & CUDA_ARRAY3D_CUBEMAP != 0;
    let gather = flags & CUDA_ARRAY3D_TEXTURE_GATHER != 0;
    let surface = flags & CUDA_ARRAY3D_SURFACE_LDST != 0;
    if w == 0 {
        return bad;
    }
    // (texture bounds, surface bounds) of the array type the extents and flags describe.
    let (tex, surf): (Bounds, Bounds) = if cubemap {
        if h != w || d == 0 {
            return bad;
        }
        if layered {
            if !d.is_multiple_of(6) {
                return bad;
            }
            (
                (lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH), usize::MAX, lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS)),
                (lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH), usize::MAX, lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS)),
            )
        } else {
            if d != 6 {
                return bad;
            }
            ((lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH), usize::MAX, 6), (lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH), usize::MAX, 6))
        }
    } else if layered {
        if d == 0 {
            return bad;
        }
        if h == 0 {
            (
                (lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH), 0, lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS)),
                (lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH), 0, lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS)),
            )
        } else {
            (
                (
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH),
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT),
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS),
                ),
                (
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH),
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT),
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS),
                ),
            )
        }
    } else {
        match (h, d) {
            (0, 0) => {
                let t = if mipmapped { A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH } else { A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH };
                ((lim(t), 0, 0), (lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH), 0, 0))
            }
            (_, 0) => {
                let (tw, th) = if gather {
                    (A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH, A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT)
                } else if mipmapped {
                    (A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH, A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT)
                } else {
                    (A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH, A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT)
                };
                ((lim(tw), lim(th), 0), (lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH), lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT), 0))
            }
            // A depth without a height describes no array type.
            (0, _) => return bad,
            _ => (
                (
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH),
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT),
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH),
                ),
                (
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH),
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT),
                    lim(A::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH),
                ),
            ),
        }
    };
    // Texture gather is for 2D arrays only.
    if gather && (layered || cubemap || h == 0 || d != 0) {
        return bad;
    }
    let fits = |(bw, bh, bd): Bounds| w <= bw && h <= bh && d <= bd;
    if fits(tex) && (!surface || fits(surf)) { Ok(()) } else { bad }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: u32 = CUDA_ARRAY3D_LAYERED;
    const C: u32 = CUDA_ARRAY3D_CUBEMAP;
    const G: u32 = CUDA_ARRAY3D_TEXTURE_GATHER;
    const S: u32 = CUDA_ARRAY3D_SURFACE_LDST;

    fn ok(w: usize, h: usize, d: usize, flags: u32) -> bool {
        check(w, h, d, flags, false).is_ok()
    }

    /// Every row of cuda.h's table at its limit and one past it.
    #[test]
    fn each_array_type_is_allowed_up_to_its_limit_and_refused_past_it() {
        for (w, h, d, flags, what) in [
            (131_072, 0, 0, 0, "1D"),
            (131_072, 65_536, 0, 0, "2D"),
            (16_384, 16_384, 16_384, 0, "3D"),
            (32_768, 0, 2048, L, "1D layered"),
            (32_768, 32_768, 2048, L, "2D layered"),
            (32_768, 32_768, 6, C, "cubemap"),
            (32_768, 32_768, 2046, C | L, "cubemap layered"),
            (32_768, 32_768, 0, G, "2D gather"),
        ] {
            assert!(ok(w, h, d, flags), "{what} at its limit");
            assert!(!ok(w + 1, if flags & C != 0 { h + 1 } else { h }, d, flags), "{what}: width past the limit");
            if h > 0 && flags & C == 0 {
                assert!(!ok(w, h + 1, d, flags), "{what}: height past the limit");
            }
            if d > 0 {
                let past = if flags & C != 0 { d + 6 } else { d + 1 };
                assert!(!ok(w, h, past, flags), "{what}: depth or layers past the limit");
            }
        }
    }

    #[test]
    fn extents_that_describe_no_array_type_are_refused() {
        assert!(!ok(0, 16, 16, 0), "no width");
        assert!(!ok(16, 0, 16, 0), "a depth without a height");
        assert!(!ok(16, 16, 0, L), "layered without layers");
        assert!(!ok(16, 32, 6, C), "a cubemap that is not square");
        assert!(!ok(16, 16, 5, C), "a cubemap of 5 faces");
        assert!(!ok(16, 16, 12, C), "12 faces without the layered flag");
        assert!(!ok(16, 16, 8, C | L), "layered cubemap faces not a multiple of 6");
        assert!(ok(16, 16, 12, C | L));
        assert!(!ok(16, 0, 0, G) && !ok(16, 16, 16, G) && !ok(16, 16, 4, G | L), "gather is 2D only");
    }

    /// Mipmapped arrays have their own 1D and 2D limits; a surface flag adds the surface limits.
    #[test]
    fn mipmapped_and_surface_limits_apply() {
        assert!(check(32_768, 32_768, 0, 0, true).is_ok());
        assert!(check(32_769, 16, 0, 0, true).is_err() && check(32_769, 16, 0, 0, false).is_ok());
        assert!(check(32_769, 0, 0, 0, true).is_err());
        assert!(ok(131_072, 0, 0, 0) && !ok(131_072, 0, 0, S), "1D surfaces are 32768 wide");
        assert!(ok(32_768, 0, 0, S));
    }
}
