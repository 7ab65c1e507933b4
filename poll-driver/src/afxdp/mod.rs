//! AF_XDP backend (Linux).
