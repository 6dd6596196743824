//! Sans-IO protocol core of urdma.
