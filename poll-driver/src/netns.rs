//! Test networks: network namespaces joined by veth pairs, removed on drop (root).
