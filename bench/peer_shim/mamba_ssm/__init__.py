"""A stand-in for the package name mamba_ssm, for running mamba_ssm's own operator tests against
our packages (bench/peer_tests.sh): the functions under test are ours, the reference functions
are mamba_ssm's own, compiled from its source at run time (see _refs.py)."""
