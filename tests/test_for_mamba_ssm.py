"""mamba_ssm 2.3.2 and transformers' Mamba-2 models on our modules with no Triton importable
(selective_scan.for_mamba_ssm). Each test runs a script in a fresh interpreter whose import of
``triton`` fails, with mamba_ssm's own Python (its sdist, unpacked) on sys.path, on CPU: the
clients' code paths (the fused training path, the chunked path, the decode step, generation)
run unmodified on our functions, so their answers can be held against each other and against
the clients' own PyTorch code."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import peer_sources
import pytest

pytest.importorskip("einops")

# The script's interpreter has no Triton, as on Windows: `import triton` raises
# ModuleNotFoundError and importlib.util.find_spec("triton") is None.
PRELUDE = """
import sys
sys.modules["triton"] = None
import torch
torch.manual_seed(0)
"""


@pytest.fixture(scope="module")
def mamba_ssm_src(tmp_path_factory):
    return peer_sources.mamba_ssm_src_or_skip(tmp_path_factory)


def run(script: str, *paths) -> str:
    """Run PRELUDE + script with ``paths`` first on sys.path; return its stdout (fail with its
    stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, paths), str(peer_sources.ROOT)]),
               CUDA_VISIBLE_DEVICES="", MAMBA_KERNELS_BACKEND="auto")
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)], env=env,
                       capture_output=True, text=True, timeout=300, cwd=str(peer_sources.ROOT / "tests"))
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_without_the_opt_in_mamba_ssm_needs_triton(mamba_ssm_src):
    out = run("""
        try:
            import mamba_ssm
        except ImportError as e:
            print("refused:", e)
    """, mamba_ssm_src)
    assert "refused:" in out and "triton" in out


def test_mamba_ssm_imports_and_takes_our_modules(mamba_ssm_src):
    out = run("""
        from selective_scan import for_mamba_ssm
        for_mamba_ssm.install()
        for_mamba_ssm.install()  # again: nothing more
        import mamba_ssm
        import mamba_ssm.ops.triton.ssd_combined as ssd, selective_scan.ssd_combined as ours
        import mamba_ssm.modules.mamba2 as m2
        from selective_scan import layernorm_gated, selective_state_update, layer_norm
        assert ssd is ours
        assert m2.mamba_chunk_scan_combined is ours.mamba_chunk_scan_combined
        assert m2.mamba_split_conv1d_scan_combined is ours.mamba_split_conv1d_scan_combined
        assert m2.RMSNormGated is layernorm_gated.RMSNorm
        assert m2.selective_state_update is selective_state_update
        import mamba_ssm.models.mixer_seq_simple as lm
        assert lm.layer_norm_fn is layer_norm.layer_norm_fn
        try:
            import triton
        except ImportError:
            print("triton still blocked")
        from mamba_ssm.modules.mamba3 import mamba3_siso_combined
        try:
            mamba3_siso_combined()
        except RuntimeError as e:
            print("mamba3:", e)
        assert sum(isinstance(f, for_mamba_ssm.Finder) for f in sys.meta_path) == 1
        for_mamba_ssm.uninstall()
        assert not for_mamba_ssm.installed()
    """, mamba_ssm_src)
    assert "triton still blocked" in out
    assert "mamba3: mamba_ssm.ops.triton.mamba3.mamba3_siso_combined.mamba3_siso_combined needs Triton" in out


def test_install_after_mamba_ssm_is_imported_names_what_was_imported(mamba_ssm_src, tmp_path):
    # a mamba_ssm whose Triton module is importable without Triton (a stand-in file of the
    # original's name): install() then comes too late and says so
    fake = tmp_path / "mamba_ssm" / "ops" / "triton"
    fake.mkdir(parents=True)
    for d in (fake.parent.parent, fake.parent, fake):
        (d / "__init__.py").write_text("")
    (fake / "ssd_combined.py").write_text("def mamba_chunk_scan_combined(*a): pass\n")
    out = run("""
        import mamba_ssm.ops.triton.ssd_combined
        from selective_scan import for_mamba_ssm
        try:
            for_mamba_ssm.install()
        except RuntimeError as e:
            print(e)
        assert not for_mamba_ssm.installed()
    """, tmp_path)
    assert "must run before mamba_ssm is imported; already imported: mamba_ssm.ops.triton.ssd_combined" in out


def test_mamba2_layer_paths_agree(mamba_ssm_src):
    """mamba_ssm's Mamba2 layer: the fused training path (split conv1d scan), the chunked path
    and the decode step, each on our functions, give the same outputs and gradients."""
    out = run("""
        from selective_scan import for_mamba_ssm
        for_mamba_ssm.install()
        import copy
        from mamba_ssm.modules.mamba2 import Mamba2
        from mamba_ssm.utils.generation import InferenceParams
        torch.manual_seed(1)
        fused = Mamba2(d_model=64, d_state=16, headdim=16, ngroups=2, chunk_size=16, layer_idx=0)
        plain = copy.deepcopy(fused)
        plain.use_mem_eff_path = False
        x = torch.randn(2, 37, 64)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = fused(xa), plain(xb)
        torch.testing.assert_close(ya, yb, rtol=1e-4, atol=1e-4)
        ya.square().sum().backward(); yb.square().sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-3, atol=1e-3)
        for (n, p), q in zip(fused.named_parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3, msg=n)
        # decode, one token at a time, from an empty cache
        with torch.no_grad():
            params = InferenceParams(max_seqlen=37, max_batch_size=2)
            conv, ssm = fused.allocate_inference_cache(2, 37)
            steps = [fused.step(x[:, t:t + 1], conv, ssm)[0] for t in range(37)]
        torch.testing.assert_close(torch.cat(steps, 1), ya.detach(), rtol=1e-4, atol=1e-4)
        print("ok")
    """, mamba_ssm_src)
    assert out.strip().endswith("ok")


def test_mamba2_lm_forward_backward_and_generation(mamba_ssm_src):
    pytest.importorskip("transformers")
    out = run("""
        from selective_scan import for_mamba_ssm
        for_mamba_ssm.install()
        from mamba_ssm.models.config_mamba import MambaConfig
        from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel
        torch.manual_seed(2)
        cfg = MambaConfig(d_model=64, n_layer=2, vocab_size=101, pad_vocab_size_multiple=8,
                          ssm_cfg={"layer": "Mamba2", "d_state": 16, "headdim": 16, "chunk_size": 16},
                          rms_norm=True, fused_add_norm=True, residual_in_fp32=True)
        model = MambaLMHeadModel(cfg)
        ids = torch.randint(0, 101, (2, 21))
        logits = model(ids).logits
        logits.float().logsumexp(-1).mean().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        model.eval()
        with torch.no_grad():
            out = model.generate(ids[:, :9], max_length=21, output_scores=True, return_dict_in_generate=True)
            full = model(out.sequences).logits
        steps = torch.stack(out.scores, 1)  # the logits each generated token was chosen from
        torch.testing.assert_close(steps, full[:, 8:20, :steps.shape[-1]], rtol=1e-3, atol=1e-3)
        print("generated", tuple(out.sequences.shape))
    """, mamba_ssm_src)
    assert "generated (2, 21)" in out


# transformers model families whose Mamba-2 mixers look their kernels up in mamba_ssm: (the
# modeling module, the model class, the config expression: tiny, one group, attention in Bamba)
FAMILIES = {
    "mamba2": ("mamba2", "Mamba2ForCausalLM",
               "Mamba2Config(vocab_size=97, hidden_size=64, state_size=16, num_heads=8, head_dim=16, "
               "n_groups=1, expand=2, num_hidden_layers=2, chunk_size=16)"),
    "bamba": ("bamba", "BambaForCausalLM",
              "BambaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, "
              "num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=8, "
              "mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=16)"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_transformers_takes_our_functions_and_agrees_with_its_own(mamba_ssm_src, family):
    """transformers' Mamba-2 models (Mamba2ForCausalLM, and the hybrid Bamba) look their kernels
    up in mamba_ssm when their module is imported: with the opt-in they find ours; the answers
    (training loss and gradient through the fused path, greedy generation through the chunked
    scan and the decode step) equal those of transformers' own PyTorch path (a process without
    mamba_ssm). One group: transformers' own PyTorch path normalises the gated output over all
    channels, where mamba_ssm's fused function (and ours) normalise each group apart, so with
    more groups the two differ by design (loss 4.8399 against 4.8462 at two groups, the Mamba-2
    model here)."""
    pytest.importorskip("transformers")
    module, model_class, config = FAMILIES[family]
    script = f"""
        import inspect
        if OPT_IN:
            from selective_scan import for_mamba_ssm
            for_mamba_ssm.install()
        import transformers
        from transformers.models.{module} import modeling_{module} as mm
        fns = (mm.mamba2_split_conv1d_scan_combined, mm.mamba2_chunk_scan, mm.mamba2_selective_state_update)
        for fn in fns:
            print("implementation:", inspect.getclosurevars(fn).nonlocals["implementation"].__module__)
        torch.manual_seed(3)
        model = transformers.{model_class}(transformers.{config})
        ids = torch.randint(0, 97, (2, 23))
        model.train()
        loss = model(ids, labels=ids).loss
        loss.backward()
        grad = sum(p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None).sqrt().item()
        model.eval()
        with torch.no_grad():
            gen = model.generate(ids[:, :7], max_new_tokens=6, do_sample=False)
        print("loss %.6f grad %.6f gen %s" % (loss.item(), grad, gen.tolist()))
    """
    ours = run("OPT_IN = True\n" + textwrap.dedent(script), mamba_ssm_src)
    theirs = run("OPT_IN = False\n" + textwrap.dedent(script))
    impls = [line.split()[1] for line in ours.splitlines() if line.startswith("implementation:")]
    assert impls == ["selective_scan.ssd_combined"] * 2 + ["selective_scan.selective_state_update"]
    assert ours.count("implementation:") == theirs.count("implementation: transformers") == 3
    a, b = ours.splitlines()[-1].split(), theirs.splitlines()[-1].split()
    assert abs(float(a[1]) - float(b[1])) < 1e-4 and abs(float(a[3]) - float(b[3])) < 1e-3 * float(b[3])
    assert a[5:] == b[5:]  # the greedy tokens
