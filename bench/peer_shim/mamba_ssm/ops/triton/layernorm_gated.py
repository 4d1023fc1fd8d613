from mamba_ssm._refs import namespace as _refs
from selective_scan.layernorm_gated import layernorm_fn, rmsnorm_fn  # noqa: F401  (under test: ours)

rms_norm_ref = _refs["rms_norm_ref"]
