//! What every wire header of this crate and of `xwarp-rdmap` is built from.
//!
//! The headers follow one convention: a checked view type over a byte buffer
//! (`Header<T: AsRef<[u8]>>` with `new_checked`, one getter and, for `AsMut` buffers, one
//! setter per field, the byte ranges in a private `field` module) plus a plain `Repr`
//! struct with `parse` (from a view) and `emit` (into a caller's buffer, never
//! allocating). See [`crate::mpa::frame`], [`crate::segment`] and `xwarp_rdmap::wire`.
//!
//! * [`be`]: reading and writing big-endian fields (all iWARP header fields are
//!   big-endian; only the MPA CRC trailer is not, see [`crate::mpa::crc`]).
//! * [`code_enum!`](crate::code_enum): the code enums of the headers (opcodes, Terminate
//!   layers, ETypes and error codes), where a byte may hold a value with no variant.

/// Big-endian field access on byte slices.
///
/// Each function reads or writes the first 2, 4 or 8 bytes of the slice it is given, so a
/// header passes `&buf[field::X]`. They panic when the slice is shorter: the views check
/// the buffer length once, in `new_checked`, and index with their fixed field ranges.
pub mod be {
    /// The big-endian `u16` in `b[..2]`.
    pub fn read_u16(b: &[u8]) -> u16 {
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The big-endian `u32` in `b[..4]`.
    pub fn read_u32(b: &[u8]) -> u32 {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The big-endian `u64` in `b[..8]`.
    pub fn read_u64(b: &[u8]) -> u64 {
        u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    /// Writes `v` big-endian into `b[..2]`.
    pub fn write_u16(b: &mut [u8], v: u16) {
        b[..2].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes `v` big-endian into `b[..4]`.
    pub fn write_u32(b: &mut [u8], v: u32) {
        b[..4].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes `v` big-endian into `b[..8]`.
    pub fn write_u64(b: &mut [u8], v: u64) {
        b[..8].copy_from_slice(&v.to_be_bytes());
    }
}

/// Declares a one-byte code enum of a wire header: a `#[repr(u8)]` enum (deriving
/// `Debug, Clone, Copy, PartialEq, Eq, Hash`) whose variants carry their wire values,
/// with
///
/// * `fn from_u8(u8) -> Option<Self>`: `None` for a byte with no variant (a reserved or
///   unknown code, which the caller answers as the RFC says);
/// * `fn as_u8(self) -> u8`, also as `From<Self> for u8`;
/// * `TryFrom<u8>`, whose error is the unknown byte.
///
/// The enum's attributes and doc comments and each variant's are kept; the values must
/// be integer literals.
///
/// ```
/// xwarp_ddp::code_enum! {
///     /// Fruit codes.
///     pub enum Fruit {
///         /// An apple.
///         Apple = 1,
///         /// A pear.
///         Pear = 0x10,
///     }
/// }
/// assert_eq!(Fruit::from_u8(0x10), Some(Fruit::Pear));
/// assert_eq!(Fruit::from_u8(2), None);
/// assert_eq!(Fruit::try_from(2u8), Err(2));
/// assert_eq!(u8::from(Fruit::Apple), 1);
/// assert_eq!(Fruit::Pear.as_u8(), 0x10);
/// ```
#[macro_export]
macro_rules! code_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $value:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        $vis enum $name {
            $(
                $(#[$vmeta])*
                $variant = $value,
            )+
        }

        impl $name {
            /// Decodes a code byte; `None` for a value with no variant.
            pub fn from_u8(v: u8) -> Option<Self> {
                match v {
                    $( $value => Some(Self::$variant), )+
                    _ => None,
                }
            }

            /// The code byte.
            pub fn as_u8(self) -> u8 {
                self as u8
            }
        }

        impl ::core::convert::TryFrom<u8> for $name {
            type Error = u8;

            fn try_from(v: u8) -> Result<Self, u8> {
                Self::from_u8(v).ok_or(v)
            }
        }

        impl ::core::convert::From<$name> for u8 {
            fn from(c: $name) -> u8 {
                c as u8
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::be;

    #[test]
    fn rfc5041_fields_are_big_endian() {
        let b = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0xff];
        assert_eq!(be::read_u16(&b), 0x0102);
        assert_eq!(be::read_u32(&b), 0x0102_0304);
        assert_eq!(be::read_u64(&b), 0x0102_0304_0506_0708);
        let mut out = [0u8; 9];
        be::write_u64(&mut out, 0x0102_0304_0506_0708);
        assert_eq!(out[..8], b[..8]);
        be::write_u32(&mut out[4..], 0xa0b0_c0d0);
        assert_eq!(out[4..8], [0xa0, 0xb0, 0xc0, 0xd0]);
        be::write_u16(&mut out[7..], 0xbeef);
        assert_eq!(out[7..], [0xbe, 0xef]);
    }

    crate::code_enum! {
        /// A test enum.
        enum Sample {
            /// Zero.
            Zero = 0,
            /// The top value.
            Top = 0xff,
        }
    }

    #[test]
    fn code_enum_maps_unknown_values_to_none() {
        for v in 0..=255u8 {
            let c = Sample::from_u8(v);
            assert_eq!(c.is_some(), v == 0 || v == 0xff);
            if let Some(c) = c {
                assert_eq!(c.as_u8(), v);
                assert_eq!(u8::from(c), v);
            }
            assert_eq!(Sample::try_from(v).ok(), c);
        }
        assert_eq!(Sample::Top as u8, 0xff);
    }
}
