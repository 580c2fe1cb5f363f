"""int4 values to the uint4b8 codes every 4-bit layout is packed from (gemm/quant.py): the codes, and
the values refused because they would wrap to a wrong code instead of failing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from moebench.gemm import quant  # noqa: E402


def test_int4_values_become_their_codes_q_plus_8():
    q = torch.arange(-8, 8, dtype=torch.int8)
    assert quant.int4_to_uint4b8(q).tolist() == list(range(16))
    assert torch.equal(quant.unpack_int4_uint4b8(quant.pack_int4_uint4b8(q.reshape(1, 1, 16))).flatten(), q)


@pytest.mark.parametrize("bad", [-9, -128, 8, 127])
def test_values_outside_minus_8_to_7_are_refused_not_wrapped(bad):
    # -9 + 8 is code 255 (uint8 wraps); 8 + 8 is 16, a fifth bit: both would pack as some other value
    with pytest.raises(ValueError, match=r"int4 values must lie in \[-8, 7\]"):
        quant.int4_to_uint4b8(torch.tensor([0, bad], dtype=torch.int8))


def test_int4_values_must_be_int8():
    with pytest.raises(TypeError, match="must be int8, got torch.int32"):
        quant.int4_to_uint4b8(torch.zeros(2, dtype=torch.int32))
