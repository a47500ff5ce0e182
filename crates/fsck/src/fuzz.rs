//! Fuzz bodies (WIP).
