//! Is this a whole PNG, and how large: the screenshot check. Walks every
//! chunk (lengths and CRC-32s), reads the header, and inflates the image
//! data to check it holds exactly one filtered row per line of the header's
//! size, so a truncated or corrupt capture fails here and not in a
//! reader's viewer later.

use std::io::Read;

/// The eight bytes every PNG starts with.
const SIGNATURE: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

/// A PNG's size and pixel format, from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PngInfo {
    /// Pixels.
    pub width: u32,
    /// Pixels.
    pub height: u32,
    pub bit_depth: u8,
    /// 0 grey, 2 RGB, 3 palette, 4 grey and alpha, 6 RGBA.
    pub color_type: u8,
}

/// Check `png` and read its header; the error says what is wrong.
pub fn check(png: &[u8]) -> Result<PngInfo, String> {
    let rest = png.strip_prefix(SIGNATURE).ok_or("no PNG signature")?;
    let mut rest = rest;
    let mut info = None;
    let mut idat = Vec::new();
    let mut ended = false;
    let mut first = true;
    while !rest.is_empty() {
        if ended {
            return Err(format!("{} bytes after IEND", rest.len()));
        }
        if rest.len() < 12 {
            return Err("a chunk cut short".into());
        }
        let len = u32::from_be_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        let kind = &rest[4..8];
        if rest.len() < 12 + len {
            return Err(format!(
                "chunk {} cut short ({len} bytes announced)",
                String::from_utf8_lossy(kind)
            ));
        }
        let data = &rest[8..8 + len];
        let crc = u32::from_be_bytes(rest[8 + len..12 + len].try_into().expect("4 bytes"));
        let mut sum = flate2::Crc::new();
        sum.update(kind);
        sum.update(data);
        if sum.sum() != crc {
            return Err(format!("chunk {}: bad CRC", String::from_utf8_lossy(kind)));
        }
        match kind {
            b"IHDR" => {
                if !first || len != 13 {
                    return Err("IHDR is not the first chunk, or not 13 bytes".into());
                }
                let width = u32::from_be_bytes(data[0..4].try_into().expect("4 bytes"));
                let height = u32::from_be_bytes(data[4..8].try_into().expect("4 bytes"));
                if width == 0 || height == 0 {
                    return Err(format!("empty image {width}x{height}"));
                }
                if data[12] != 0 {
                    return Err("interlaced (Chromium does not interlace)".into());
                }
                info = Some(PngInfo {
                    width,
                    height,
                    bit_depth: data[8],
                    color_type: data[9],
                });
            }
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => ended = true,
            _ => {}
        }
        if first && kind != b"IHDR" {
            return Err("the first chunk is not IHDR".into());
        }
        first = false;
        rest = &rest[12 + len..];
    }
    let info = info.ok_or("no IHDR")?;
    if !ended {
        return Err("no IEND: the file is cut short".into());
    }
    let channels: u64 = match info.color_type {
        0 | 3 => 1,
        4 => 2,
        2 => 3,
        6 => 4,
        other => return Err(format!("unknown colour type {other}")),
    };
    let row_bits = u64::from(info.width) * channels * u64::from(info.bit_depth);
    // Each row: one filter byte, then the row's pixels rounded up to a byte.
    let expected = u64::from(info.height) * (1 + row_bits.div_ceil(8));
    let mut inflated = flate2::read::ZlibDecoder::new(idat.as_slice()).take(expected + 1);
    let got = std::io::copy(&mut inflated, &mut std::io::sink())
        .map_err(|e| format!("the image data does not inflate: {e}"))?;
    if got != expected {
        return Err(format!(
            "the image data inflates to {got} bytes, {expected} expected for {}x{}",
            info.width, info.height
        ));
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2×1 RGB PNG, made by hand: signature, IHDR, IDAT, IEND.
    fn tiny() -> Vec<u8> {
        fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
            out.extend_from_slice(&(data.len() as u32).to_be_bytes());
            out.extend_from_slice(kind);
            out.extend_from_slice(data);
            let mut c = flate2::Crc::new();
            c.update(kind);
            c.update(data);
            out.extend_from_slice(&c.sum().to_be_bytes());
        }
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&2u32.to_be_bytes());
        ihdr.extend_from_slice(&1u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        let raw = [0u8, 255, 0, 0, 0, 0, 255];
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut z, &raw).expect("deflate");
        let idat = z.finish().expect("deflate");
        let mut png = SIGNATURE.to_vec();
        chunk(&mut png, b"IHDR", &ihdr);
        chunk(&mut png, b"IDAT", &idat);
        chunk(&mut png, b"IEND", &[]);
        png
    }

    #[test]
    fn a_whole_png_is_read() {
        let info = check(&tiny()).expect("valid");
        assert_eq!((info.width, info.height, info.color_type), (2, 1, 2));
    }

    #[test]
    fn every_cut_and_every_flipped_byte_is_refused() {
        let png = tiny();
        for cut in 0..png.len() {
            assert!(check(&png[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..png.len() {
            let mut bad = png.clone();
            bad[i] ^= 0x01;
            assert!(check(&bad).is_err(), "byte {i} flipped");
        }
    }
}
