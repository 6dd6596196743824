//! urdma verbs provider.
