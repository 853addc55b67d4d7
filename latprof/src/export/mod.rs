//! Output formats.
pub mod text;
