"""The node runtime: one phalanx node under trio.

`node` assembles a node (storage, replica, core, driver, peer transport, client port);
`driver*` and `group_commit` carry out the core's `Ready` bundles (persist before send);
`persistence` and `identity` own what is durable; `client_port`, `client_auth` and
`waiters` serve clients; `ticker`, `metrics`, `phase_trace`, `process_tuning`,
`descriptors` and `fault_hooks` are the process around it.
"""
