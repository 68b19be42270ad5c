"""Operating a cluster: node and cluster configuration files (`node_config`), the cluster's
PKI (`pki`) and protocol signing keys (`signing_keys`), listen ports (`ports`), and
`phalanx cluster init/up` for a local cluster directory (`local_cluster`)."""
