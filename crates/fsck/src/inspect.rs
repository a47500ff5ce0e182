//! Format inspector (WIP).
