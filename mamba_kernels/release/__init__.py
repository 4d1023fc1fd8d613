"""Release tooling: the build matrix, the static wheel index and the fat-binary reader."""
