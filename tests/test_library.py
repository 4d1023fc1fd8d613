"""mamba_kernels.runtime.library: the eager entry of an op and the compile-time switch back to
its packet (what the kernels' Python calls on every call)."""

import pytest
import torch

from mamba_kernels.runtime import library

_LIB = torch.library.Library("mk_test_library", "DEF")
_LIB.define("scale(Tensor x, float factor, bool negate=False) -> Tensor")


def _scale(x, factor, negate=False):
    return x * (-factor if negate else factor)


_LIB.impl("scale", _scale, "CPU")
_LIB.impl("scale", _scale, "Meta")
PACKET = torch.ops.mk_test_library.scale
ENTRY = library.eager_entry(PACKET)


def test_the_entry_is_not_the_packet_and_gives_what_the_packet_gives():
    assert ENTRY is not PACKET and ENTRY is not PACKET.default
    x = torch.randn(5)
    assert torch.equal(ENTRY(x, 2.0), PACKET(x, 2.0))
    assert torch.equal(ENTRY(x, 2.0, True), PACKET(x, 2.0, True))
    assert torch.equal(ENTRY(x, 3.0, negate=True), PACKET(x, 3.0, negate=True))


def test_the_entry_refuses_bad_arguments_as_the_packet_does():
    for bad in (("x", 2.0), (torch.randn(3), "two")):
        with pytest.raises(RuntimeError) as by_packet:
            PACKET(*bad)
        with pytest.raises(RuntimeError) as by_entry:
            ENTRY(*bad)
        assert str(by_entry.value) == str(by_packet.value)


def test_pick_gives_the_entry_eagerly_and_the_packet_to_torch_compile():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x):
        op = library.pick(PACKET, ENTRY)
        return op(x, 2.0) + 1

    assert library.is_compiling() is False
    assert library.pick(PACKET, ENTRY) is ENTRY  # eagerly, the entry
    x = torch.randn(4)
    torch._dynamo.reset()
    out = torch.compile(f, backend=backend, fullgraph=True)(x)
    assert torch.equal(out, x * 2.0 + 1)
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("mk_test_library" in str(t) for t in targets), targets
