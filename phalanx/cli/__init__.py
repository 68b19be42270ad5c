"""The `phalanx` command line: `main` builds the argparse tree; each command's module
(`kv`, `node`, `cert`, and the ops and demo commands) is imported only when it runs.
`errors` owns exit codes and one-line errors."""
