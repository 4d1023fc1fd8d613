"""How far bf16 alone moves a random-weight transformers MambaForCausalLM's logits (CPU).

    PYTHONPATH=<a directory with transformers> python3 bench/experiments/bf16_sensitivity.py

The model of bench/e2e_mamba.py (d_model 768, 4 layers, vocab 1024, seed 0), its own PyTorch
path, run in float32 and, with the same weights, in bfloat16, on a 256-token sequence; prints
max |bf16 - fp32| / max |fp32| of the logits, the measure e2e_mamba.py's tolerances use. It is the
yardstick for a bf16 difference between two kernel implementations of the same model.
"""

import torch
from transformers import MambaConfig, MambaForCausalLM


def main() -> None:
    torch.manual_seed(0)
    cfg = MambaConfig(vocab_size=1024, hidden_size=768, num_hidden_layers=4, state_size=16, expand=2,
                      conv_kernel=4, use_cache=True)
    m32 = MambaForCausalLM(cfg).eval()
    m16 = MambaForCausalLM(cfg).eval()
    m16.load_state_dict(m32.state_dict())
    m16 = m16.to(torch.bfloat16)
    ids = torch.randint(0, 1024, (1, 256), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        l32 = m32(ids, use_cache=False).logits.double()
        l16 = m16(ids, use_cache=False).logits.double()
    rel = ((l16 - l32).abs().max() / l32.abs().max()).item()
    print(f"bf16 vs fp32 logits, max rel. difference: {rel:.3e}")


if __name__ == "__main__":
    main()
