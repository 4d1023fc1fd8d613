from mamba_ssm._refs import namespace as _refs
from selective_scan import selective_state_update  # noqa: F401  (under test: ours)

selective_state_update_ref = _refs["selective_state_update_ref"]
